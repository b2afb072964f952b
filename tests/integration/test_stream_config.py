"""The log's configuration is declared, not overwritten: against real nats-servers, a
service connecting, the log reader and `gpuloom audit`/`replay` leave an existing
stream's replicas and limits as they are, log what differs once, and the read-only
tools neither create nor change a missing log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NoStreamResponseError
from typer.testing import CliRunner

from gpuloom.bus import EventBus, Outgoing, StreamMissingError, streams
from gpuloom.bus.reader import read_log
from gpuloom.client.cli import app
from gpuloom.devstack import free_port, nats_server_binary
from gpuloom.events import JobSubmitted, encode, make_envelope, subject_for
from gpuloom.testing.builders import T0, make_job_spec

pytestmark = pytest.mark.integration

KEPT = ("num_replicas", "duplicate_window", "max_msgs", "max_bytes", "max_age", "subjects")


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each difference is logged once per process: start each test with none logged."""
    monkeypatch.setattr(streams, "_warned", set())


async def _config(url: str, name: str = "GPULOOM") -> dict[str, Any]:
    nc = await nats.connect(url)
    try:
        config = (await nc.jetstream().stream_info(name)).config
    finally:
        await nc.close()
    return {key: getattr(config, key) for key in KEPT}


async def _create(url: str, config: StreamConfig, attempts: int = 40) -> None:
    """Create a stream as an operator would (retrying while a cluster elects its leader),
    and wait, as the operator checks `nats stream info`, until it has a leader and every
    replica is current: a publish before then finds no responder (CI, 2026-12-05)."""
    nc = await nats.connect(url)
    try:
        js = nc.jetstream(timeout=2)
        for attempt in range(attempts):
            try:
                await js.add_stream(config)
                break
            except Exception:
                if attempt == attempts - 1:
                    raise
                await asyncio.sleep(0.25)
        for attempt in range(attempts):
            try:
                cluster = (await js.stream_info(str(config.name))).cluster
            except Exception:
                cluster = None
                if attempt == attempts - 1:
                    raise
            else:
                replicas = list(cluster.replicas or []) if cluster is not None else []
                if cluster is None or (
                    cluster.leader
                    and len(replicas) == (config.num_replicas or 1) - 1
                    and all(replica.current for replica in replicas)
                ):
                    return
            await asyncio.sleep(0.25)
        raise AssertionError(f"stream {config.name} has no leader and current replicas yet")
    finally:
        await nc.close()


async def _service_connects_and_writes(url: str, replicas: int, attempts: int = 40) -> None:
    """What a service does (runtime.service.connect_bus with its settings), twice.

    Like a reactor, it publishes again after a failed publish (the same message id, so
    the log holds it once): a stream just created in a cluster, with its leader elected
    and its replicas current, still refused the first write with "no responders" under
    load (CI, 2026-12-05, twice), until its subject's interest reached this server."""
    for _ in range(2):
        bus = await EventBus.connect(
            url, "GPULOOM", name="svc", dedup_window_s=7200, replicas=replicas
        )
        try:
            event = JobSubmitted(job_id="j1", spec=make_job_spec())
            envelope = make_envelope(event, at=T0, by="test", event_id="evt-1")
            message = Outgoing(subject_for(event), encode(envelope), {"Nats-Msg-Id": "1"})
            for attempt in range(attempts):
                try:
                    await bus.publish(message)
                    break
                except NoStreamResponseError:
                    if attempt == attempts - 1:
                        raise
                    await asyncio.sleep(0.25)
        finally:
            await bus.close()


def _tools_read(url: str) -> None:
    """The log reader, `gpuloom audit` (which also writes its result) and `replay`."""
    assert [r.event.aggregate_id() for r in asyncio.run(read_log(url))] == ["j1"]
    runner = CliRunner()
    audited = runner.invoke(app, ["audit", "--nats", url, "--json"])
    assert audited.exit_code == 0, audited.output
    replayed = runner.invoke(app, ["replay", "--at", "1", "--nats", url, "--json"])
    assert replayed.exit_code == 0, replayed.output


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "gpuloom.bus.streams"]


def test_an_operators_limits_and_duplicate_window_survive_services_and_tools(
    nats_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    operator = StreamConfig(
        name="GPULOOM",
        subjects=["gpuloom.evt.>"],
        storage=StorageType.FILE,
        num_replicas=1,
        duplicate_window=60,
        max_msgs=1_000_000,
        max_bytes=2**30,
        allow_direct=True,
    )
    asyncio.run(_create(nats_url, operator))
    before = asyncio.run(_config(nats_url))

    with caplog.at_level(logging.WARNING, logger="gpuloom.bus.streams"):
        asyncio.run(_service_connects_and_writes(nats_url, replicas=1))
        _tools_read(nats_url)

    assert asyncio.run(_config(nats_url)) == before
    assert before["max_msgs"] == 1_000_000 and before["duplicate_window"] == 60
    [warning] = _warnings(caplog)  # logged once, though the service connected twice
    assert "duplicate window 60s (this process expected 7200s)" in warning
    dead_letters = asyncio.run(_config(nats_url, "GPULOOM_DLQ"))
    assert dead_letters["subjects"] == ["gpuloom.dlq.>"] and dead_letters["max_msgs"] == 100_000


def test_read_only_tools_neither_create_nor_change_a_missing_log(nats_url: str) -> None:
    with pytest.raises(StreamMissingError, match="no stream GPULOOM at nats://"):
        asyncio.run(read_log(nats_url))
    runner = CliRunner()
    for args in (["audit", "--nats", nats_url], ["replay", "--at", "1", "--nats", nats_url]):
        result = runner.invoke(app, args)
        assert result.exit_code == 1, result.output
        assert "no stream GPULOOM" in result.stderr

    async def stream_names() -> list[str]:
        nc = await nats.connect(nats_url)
        try:
            return sorted(info.config.name or "" for info in await nc.jetstream().streams_info())
        finally:
            await nc.close()

    assert asyncio.run(stream_names()) == []
    asyncio.run(_service_connects_and_writes(nats_url, replicas=1))  # as the admin's setup
    assert asyncio.run(stream_names()) == ["GPULOOM", "GPULOOM_DLQ", "GPULOOM_VIEW"]
    assert asyncio.run(_config(nats_url))["duplicate_window"] == 7200


# --- the documented 3-server deployment ------------------------------------------------


@contextlib.contextmanager
def nats_cluster(base: Path, size: int = 3, timeout: float = 30) -> Iterator[list[str]]:
    """`size` JetStream servers routed into one cluster; yields their URLs."""
    ports = [(free_port(), free_port(), free_port()) for _ in range(size)]
    routes = ",".join(f"nats://127.0.0.1:{cluster}" for _, cluster, _ in ports)
    processes = []
    try:
        for i, (client, cluster, monitor) in enumerate(ports):
            args = [
                nats_server_binary(), "-js", "-sd", str(base / f"n{i}"), "-a", "127.0.0.1",
                "-p", str(client), "-m", str(monitor), "--server_name", f"n{i}",
                "--cluster_name", "gpuloom", "--cluster", f"nats://127.0.0.1:{cluster}",
                "--routes", routes,
            ]  # fmt: skip
            log = open(base / f"n{i}.log", "ab")  # noqa: SIM115
            processes.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT))
            log.close()
        deadline = time.monotonic() + timeout
        for _, _, monitor in ports:  # full health: JetStream current with a meta leader
            while not _healthy(f"http://127.0.0.1:{monitor}/healthz"):
                assert time.monotonic() < deadline, "the NATS cluster did not form"
                time.sleep(0.1)
        yield [f"nats://127.0.0.1:{client}" for client, _, _ in ports]
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def test_services_and_audit_leave_three_replicas_as_they_are(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with nats_cluster(tmp_path) as urls:
        url = urls[0]
        operator = StreamConfig(
            name="GPULOOM",
            subjects=["gpuloom.evt.>"],
            storage=StorageType.FILE,
            num_replicas=3,
            duplicate_window=7200,
            allow_direct=True,
        )
        asyncio.run(_create(url, operator))

        with caplog.at_level(logging.WARNING, logger="gpuloom.bus.streams"):
            asyncio.run(_service_connects_and_writes(url, replicas=1))  # the default setting
            _tools_read(url)

        assert asyncio.run(_config(url))["num_replicas"] == 3
        assert asyncio.run(_config(urls[2]))["num_replicas"] == 3
        assert _warnings(caplog) == [
            "stream GPULOOM is not as this process expected, left unchanged: "
            "replicas 3 (this process expected 1)"
        ]
        assert asyncio.run(_config(url, "GPULOOM_DLQ"))["num_replicas"] == 3

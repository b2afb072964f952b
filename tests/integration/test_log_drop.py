"""Bounding the stream: the log's start is exported, folded into the base snapshot and
dropped; processes without a snapshot of their own start from the base one, and one
with no snapshot at all refuses to fold a log from its middle. Real nats-server, real
services; audit and replay from seq 1 read the dropped events from the archive (no
audit at the end of the fixture: the stream no longer starts at seq 1)."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path

import pytest
from restart_helpers import run_jobs, wait_log
from typer.testing import CliRunner

from gpuloom.bus import EventBus
from gpuloom.bus.archive import read_archive
from gpuloom.bus.jsapi import BASE_BUCKET, bucket_of
from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.client.cli import app
from gpuloom.devstack import wait_http
from gpuloom.runtime.follower import LogFollower
from gpuloom.state import ClusterState
from gpuloom.state.snapshot import decode_snapshot
from gpuloom.testing.cluster import DEFAULT_NODES, Cluster

pytestmark = pytest.mark.integration


async def _figures(url: str) -> tuple[int, int]:
    bus = await EventBus.connect(url, "GPULOOM", name="check", create=False)
    try:
        figures = await bus.stream_figures()
        return figures.first_seq, figures.last_seq
    finally:
        await bus.close()


async def _base_and_forget(url: str, *buckets: str) -> ClusterState:
    """The base snapshot; and the given buckets deleted (processes with no snapshot)."""
    bus = await EventBus.connect(url, "GPULOOM", name="check", create=False)
    try:
        base = SnapshotStore(bus.js, "base", bucket=BASE_BUCKET)
        state = decode_snapshot(await base.read((await base.stored())[0]))
        for bucket in buckets:
            await bus.js.delete_object_store(bucket)
        return state
    finally:
        await bus.close()


def test_the_logs_start_is_dropped_once_archived_and_folded_into_the_base_snapshot(
    nats_url: str, tmp_path: Path
) -> None:
    agents = {"agent-a": [DEFAULT_NODES[0]], "agent-b": [DEFAULT_NODES[1]]}
    data = tmp_path / "data"
    cluster = Cluster(nats_url, f"sqlite+aiosqlite:///{tmp_path}/gpuloom.db", data, agents)
    try:
        cluster.start()
        cluster.wait_nodes_ready(2)
        stack = cluster.stack
        assert stack is not None
        run_jobs(cluster, 4, "old")
        _, last = asyncio.run(_figures(nats_url))
        archive = tmp_path / "archive"
        runner = CliRunner()
        refused = runner.invoke(
            app,
            ["archive", "drop", "--archive", str(archive), "--upto", str(last), "--nats", nats_url],
        )
        assert refused.exit_code == 1 and "no archive there" in refused.output
        exported = runner.invoke(
            app, ["archive", "export", "--to", str(archive), "--nats", nats_url]
        )
        assert exported.exit_code == 0, exported.output
        dropped = runner.invoke(
            app,
            ["archive", "drop", "--archive", str(archive), "--upto", str(last), "--nats", nats_url],
        )
        assert dropped.exit_code == 0, dropped.output
        assert f"the stream now starts at seq {last + 1}" in dropped.output
        assert asyncio.run(_figures(nats_url))[0] == last + 1

        # the base snapshot is the fold of the archived log, as every process folds it
        folder = LogFollower(None, "test")
        for message in read_archive(archive, last):
            folder.fold(message)
        expected = folder.state
        for name in ("placement", "queue"):
            stack.kill(name, signal.SIGTERM)
        base = asyncio.run(_base_and_forget(nats_url, bucket_of("placement"), bucket_of("queue")))
        assert base == expected and base.seq == last

        for name in ("placement", "queue", "gateway"):  # the gateway keeps its own
            stack.restart(name)
        for name in ("placement", "queue"):
            wait_log(
                data / "logs" / f"{name}.log", rf"starts from the base snapshot at seq {last}\b"
            )
        wait_http(f"{cluster.gateway_url}/readyz", timeout=60)
        run_jobs(cluster, 3, "new")

        # the audit cannot start from seq 1 any more; from a snapshot it can
        plain = runner.invoke(app, ["audit", "--nats", nats_url, "--no-record"])
        assert plain.exit_code == 1 and "its start was dropped" in plain.output, plain.output
        audited = runner.invoke(
            app, ["audit", "--from-snapshot", "--nats", nats_url, "--no-record"]
        )
        assert audited.exit_code == 0, audited.output
        # and with the archive, from seq 1 again: the dropped events read from its segments
        whole = runner.invoke(
            app, ["audit", "--archive", str(archive), "--nats", nats_url, "--no-record", "--json"]
        )
        assert whole.exit_code == 0, whole.output
        report = json.loads(whole.output[whole.output.index("{") :])
        assert report["start"] is None and report["to_seq"] > last
        assert report["verified"] == 7  # the 4 old jobs' placements too, re-made
        early = ["replay", "--at", str(last // 2), "--from-start", "--nats", nats_url, "--json"]
        refused = runner.invoke(app, early)
        assert refused.exit_code == 1 and "--archive DIR" in refused.output, refused.output
        replayed = runner.invoke(app, [*early, "--archive", str(archive)])
        assert replayed.exit_code == 0, replayed.output
        assert f'"seq": {last // 2}' in replayed.output

        # a process with no snapshot at all, not even the base: it will not start
        stack.kill("admission", signal.SIGTERM)
        asyncio.run(_base_and_forget(nats_url, bucket_of("admission"), BASE_BUCKET))
        stack.restart("admission")
        wait_log(data / "logs" / "admission.log", r"will not fold a log from its middle")
    finally:
        cluster.stop()

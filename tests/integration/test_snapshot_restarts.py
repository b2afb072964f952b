"""Services restart from their snapshots, skip one they cannot trust, and decide as
before: real services, real nats-server, the audit of the whole log at the end
(the `cluster` fixture's teardown)."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from pathlib import Path

import pytest

from gpuloom.bus import EventBus
from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.devstack import wait_http
from gpuloom.testing.cluster import Cluster

pytestmark = pytest.mark.integration

SCHEDULERS = ("admission", "queue", "placement", "inventory", "accounting", "gateway")


def _log(cluster: Cluster, service: str) -> str:
    return (cluster.data_dir / "logs" / f"{service}.log").read_text(errors="replace")


def _wait_log(path: Path, pattern: str, timeout: float = 30) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while (found := re.search(pattern, path.read_text(errors="replace"))) is None:
        assert time.monotonic() < deadline, f"{path.name} never said /{pattern}/"
        time.sleep(0.2)
    return found


def _run(cluster: Cluster, count: int, tag: str) -> None:
    ids = [
        cluster.submit(name=f"{tag}-{i}", gpus=1, command=["sh", "-c", "true"])
        for i in range(count)
    ]
    done = cluster.wait_final(ids, timeout=90)
    assert {job["state"] for job in done.values()} == {"succeeded"}, done


def test_every_service_restarts_from_its_snapshot(cluster: Cluster) -> None:
    stack = cluster.stack
    assert stack is not None
    _run(cluster, 4, "before")
    for service in SCHEDULERS:  # a clean stop stores the state it has folded
        stack.kill(service, signal.SIGTERM)
        assert "wrote its snapshot at seq" in _log(cluster, service), _log(cluster, service)[-2000:]
        stack.restart(service)
    for service in SCHEDULERS:
        logs = cluster.data_dir / "logs" / f"{service}.log"
        started = _wait_log(logs, r"starts from its snapshot at seq (\d+)")
        assert int(started.group(1)) > 0
    wait_http(f"{cluster.gateway_url}/readyz", timeout=30)
    listed = cluster.http.get("/v1/jobs", params={"limit": 100}).json()
    assert sum(job["name"].startswith("before-") for job in listed["jobs"]) == 4
    _run(cluster, 3, "after")  # and they decide as before (the audit checks every decision)


async def _plant(nats_url: str, service: str, seq: int, data: bytes) -> list[int]:
    bus = await EventBus.connect(nats_url, "GPULOOM", name="planter", create=False)
    try:
        store = SnapshotStore(bus.js, service, keep=10)
        await store.write(seq, data)
        return [s.seq for s in await store.stored()]
    finally:
        await bus.close()


def test_a_damaged_newest_snapshot_is_skipped_for_the_one_before(cluster: Cluster) -> None:
    stack = cluster.stack
    assert stack is not None
    _run(cluster, 2, "before")
    stack.kill("placement", signal.SIGTERM)
    good = re.findall(r"wrote its snapshot at seq (\d+)", _log(cluster, "placement"))
    assert good, _log(cluster, "placement")[-2000:]
    # a newer snapshot that is only the start of one (a torn write, an edited file)
    stored = asyncio.run(_plant(cluster.nats_url, "placement", int(good[-1]) + 5, b"GPULOOM-SNAP"))
    assert stored[0] == int(good[-1]) + 5
    stack.restart("placement")
    logs = cluster.data_dir / "logs" / "placement.log"
    _wait_log(logs, rf"skips snapshot seq-0*{int(good[-1]) + 5}: ")
    _wait_log(logs, rf"starts from its snapshot at seq {good[-1]}\b")
    _run(cluster, 2, "after")

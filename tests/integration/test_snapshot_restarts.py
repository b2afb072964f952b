"""Services restart from their snapshots, skip one they cannot trust, and decide as
before: real services, real nats-server, the audit of the whole log at the end
(the `cluster` fixture's teardown)."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from dataclasses import replace

import pytest
from projection_helpers import put, submit
from restart_helpers import run_jobs, wait_log

from gpuloom.bus import EventBus, Incoming
from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.devstack import SERVICES, wait_http
from gpuloom.events import Decision, Recorded, decode
from gpuloom.runtime.reactor import Reactor
from gpuloom.runtime.snapshots import SnapshotPolicy, Snapshotter
from gpuloom.state import ClusterState, fold
from gpuloom.state.snapshot import _pack, _split, encode_snapshot
from gpuloom.testing.cluster import Cluster

pytestmark = pytest.mark.integration

#: Every process that folds the log (agents hold their nodes' view, and no snapshot).
PROCESSES = SERVICES


def _log(cluster: Cluster, service: str) -> str:
    return (cluster.data_dir / "logs" / f"{service}.log").read_text(errors="replace")


def test_every_service_restarts_from_its_snapshot(cluster: Cluster) -> None:
    stack = cluster.stack
    assert stack is not None
    run_jobs(cluster, 4, "before")
    for service in PROCESSES:  # a clean stop stores the state it has folded
        stack.kill(service, signal.SIGTERM)
        assert "wrote its snapshot at seq" in _log(cluster, service), _log(cluster, service)[-2000:]
        stack.restart(service)
    for service in PROCESSES:
        logs = cluster.data_dir / "logs" / f"{service}.log"
        started = wait_log(logs, r"starts from its snapshot at seq (\d+)")
        assert int(started.group(1)) > 0
    wait_http(f"{cluster.gateway_url}/readyz", timeout=30)
    listed = cluster.http.get("/v1/jobs", params={"limit": 100}).json()
    assert sum(job["name"].startswith("before-") for job in listed["jobs"]) == 4
    run_jobs(cluster, 3, "after")  # and they decide as before (the audit checks every decision)


async def _plant(nats_url: str, service: str, good: int) -> list[int]:
    """Beside the service's good snapshot at `good`: one of another state schema (as an
    older or newer version writes) at good+3, and one cut short at good+5."""
    bus = await EventBus.connect(nats_url, "GPULOOM", name="planter", create=False)
    try:
        store = SnapshotStore(bus.js, service, keep=10, create=True)
        data = await store.read((await store.stored())[0])
        header, start = _split(data)
        other = replace(header, fingerprint="0123456789abcdef", seq=good + 3)
        await store.write(good + 3, _pack(other, data[start:-32]))
        await store.write(good + 5, data[: len(data) // 2])
        return [s.seq for s in await store.stored()]
    finally:
        await bus.close()


def test_snapshots_cut_short_or_of_another_schema_are_skipped_for_the_one_before(
    cluster: Cluster,
) -> None:
    stack = cluster.stack
    assert stack is not None
    run_jobs(cluster, 2, "before")
    stack.kill("placement", signal.SIGTERM)
    good = re.findall(r"wrote its snapshot at seq (\d+)", _log(cluster, "placement"))
    assert good, _log(cluster, "placement")[-2000:]
    last = int(good[-1])
    assert asyncio.run(_plant(cluster.nats_url, "placement", last))[:3] == [
        last + 5,
        last + 3,
        last,
    ]
    # jobs come while placement is away: the log goes on past the planted ones
    waiting = [cluster.submit(name=f"waiting-{i}", gpus=1, command=["true"]) for i in range(3)]
    deadline = time.monotonic() + 30
    while len(cluster.read_log()) < last + 6:
        assert time.monotonic() < deadline, "admission and queue never answered"
        time.sleep(0.2)
    stack.restart("placement")
    logs = cluster.data_dir / "logs" / "placement.log"
    cut = wait_log(logs, rf"skips snapshot seq-0*{last + 5}: (.*)")
    other = wait_log(logs, rf"skips snapshot seq-0*{last + 3}: (.*)")
    assert "written by schema 0123456789abcdef" in other.group(1), other.group(0)
    assert cut.group(1), cut.group(0)
    wait_log(logs, rf"starts from its snapshot at seq {last}\b")
    assert {j["state"] for j in cluster.wait_final(waiting, timeout=60).values()} == {"succeeded"}
    run_jobs(cluster, 2, "after")


async def test_restored_at_the_logs_end_it_decides_without_waiting_for_an_event(
    bus: EventBus,
) -> None:
    """Nothing comes after the snapshot: the service still decides on what it holds
    (found by bench/restart_catchup.py: admission and queue waited for an event)."""
    last = await put(bus, submit("waiting-for-admission"))
    store = SnapshotStore(bus.js, "admission", create=True)
    log = (await bus.stream_figures()).created
    await store.write(last, encode_snapshot(fold(await read_all(bus, last)), log))
    decided = asyncio.Event()
    seen: list[int] = []

    async def decide(state: ClusterState) -> list[Decision]:
        seen.append(state.seq)
        decided.set()
        return []

    stop = asyncio.Event()
    reactor = Reactor(bus, "admission", decide, snapshots=Snapshotter(store, SnapshotPolicy()))
    task = asyncio.create_task(reactor.run(stop))
    try:
        await asyncio.wait_for(decided.wait(), 5)
    finally:
        stop.set()
        await task
    assert seen[0] == last and "waiting-for-admission" in reactor.state.submitted


async def test_a_snapshot_of_a_log_made_anew_is_never_taken_for_its_state(bus: EventBus) -> None:
    """The stream deleted and made again restarts at seq 1: the old log's snapshot, at
    a seq the new log has reached, is skipped, and pruned once the new log is past it."""
    old_last = await put(bus, submit("old-1"), submit("old-2"), submit("old-3"))
    old = await bus.stream_figures()
    store = SnapshotStore(bus.js, "queue", keep=1, create=True)
    await store.write(old_last, encode_snapshot(fold(await read_all(bus, old_last)), old.created))
    await bus.js.delete_stream(bus.stream)
    await bus.ensure_stream()
    new_last = await put(bus, *(submit(f"new-{i}") for i in range(4)))
    new = await bus.stream_figures()
    assert new.created != old.created and new_last > old_last
    snapshotter = Snapshotter(store, SnapshotPolicy())
    assert await snapshotter.restore(at_most=new_last, log_created=new.created) is None
    state = fold(await read_all(bus, new_last))
    assert "old-1" not in state.submitted
    await store.write(new_last, encode_snapshot(state, new.created))
    assert await snapshotter.restore(at_most=new_last, log_created=new.created) == state


async def read_all(bus: EventBus, last: int) -> list[Recorded]:
    records: list[Recorded] = []
    done = asyncio.Event()

    async def on_message(message: Incoming) -> None:
        records.append(
            decode(message.seq, message.body, message.stored_at, subject=message.subject)
        )
        if message.seq >= last:
            done.set()

    unsubscribe = await bus.follow(on_message)
    await asyncio.wait_for(done.wait(), 10)
    await unsubscribe()
    return records

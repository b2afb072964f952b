"""When a snapshot is due: after `every_events` events or `every_s` seconds, and while
the process replays the log only every `REPLAY_EVERY_S` seconds."""

from __future__ import annotations

from typing import cast

from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.runtime.snapshots import REPLAY_EVERY_S, SnapshotPolicy, Snapshotter
from gpuloom.state import ClusterState


class Store:
    service = "queue"
    bucket = "GPULOOM_SNAP_QUEUE"


def at(seq: int) -> ClusterState:
    state = ClusterState()
    state.seq = seq
    return state


def test_due_after_its_events_or_its_seconds_and_while_replaying_by_time_only() -> None:
    now = [0.0]
    snapshots = Snapshotter(
        cast(SnapshotStore, Store()),
        SnapshotPolicy(every_events=100, every_s=300),
        clock=lambda: now[0],
    )
    assert not snapshots.due(at(99))
    assert snapshots.due(at(100))
    assert not snapshots.due(at(100_000), replaying=True)  # thousands of events: not yet
    now[0] = REPLAY_EVERY_S
    assert snapshots.due(at(100_000), replaying=True)
    assert not snapshots.due(at(50))  # neither 100 events nor 300 s
    now[0] = 300.0
    assert snapshots.due(at(1))
    assert not snapshots.due(at(0), replaying=True)  # nothing new since the last one

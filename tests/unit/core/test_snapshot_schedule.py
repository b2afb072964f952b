"""When a snapshot is due: after `every_events` events or `every_s` seconds, and while
the process replays the log only every `REPLAY_EVERY_S` seconds; each process at its
own points of the log, so that they do not all pause at once."""

from __future__ import annotations

from itertools import pairwise
from typing import cast

from gpuloom.bus.identities import agent_bucket, bucket_of
from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.runtime.snapshots import REPLAY_EVERY_S, SnapshotPolicy, Snapshotter, stagger
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
        phase=0,
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


def written_at(snapshots: Snapshotter, last: int, batch: int = 7) -> list[int]:
    """The seqs at which `snapshots` writes while the log grows to `last`, `batch`
    events folded at a time (`_serialize` would move `written_seq` so)."""
    written = []
    for seq in range(batch, last + 1, batch):
        if snapshots.due(at(seq)):
            snapshots.written_seq = seq
            written.append(seq)
    return written


def test_each_process_writes_at_its_own_points_every_events_apart() -> None:
    store = Store()
    store.bucket = "GPULOOM_SNAP_PLACEMENT"
    snapshots = Snapshotter(cast(SnapshotStore, store), SnapshotPolicy(every_events=100, every_s=0))
    phase = stagger("GPULOOM_SNAP_PLACEMENT", 100)
    assert snapshots.phase == phase and 0 <= phase < 100
    written = written_at(snapshots, 1000)
    first = 100 - phase
    assert written[0] == min(s for s in range(7, 1001, 7) if s >= first)
    gaps = [b - a for a, b in pairwise(written)]
    assert gaps and all(100 - 7 < gap < 100 + 7 for gap in gaps), gaps  # within a batch
    for seq in written:  # each one is the first fold past one of its points
        assert (seq + phase) // 100 > (seq - 7 + phase) // 100


def test_the_services_and_agents_are_spread_over_the_log() -> None:
    buckets = [bucket_of(s) for s in ("inventory", "admission", "queue", "placement")]
    buckets += [bucket_of(s) for s in ("accounting", "gateway")]
    buckets += [agent_bucket([f"n{i}"]) for i in range(2)]
    points = sorted(stagger(bucket, 10_000) for bucket in buckets)
    assert len(set(points)) == len(points), "no two at the same point"
    assert stagger("GPULOOM_SNAP_QUEUE", 0) == 0, "no snapshots by events: no point"

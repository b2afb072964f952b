"""Replay: the cluster as it was at a sequence or a time, rebuilt by folding the log
(from sequence 1, or on from a snapshot before that point)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from gpuloom.events import Recorded
from gpuloom.queueing.order import queue_order
from gpuloom.state import ClusterState, apply


def state_at(
    records: Sequence[Recorded],
    seq: int | None = None,
    at: datetime | None = None,
    start: ClusterState | None = None,
) -> ClusterState:
    """Fold `records` up to and including `seq` (or the last event written at or before `at`).

    `start`: a trusted snapshot's state to fold on from, in place, instead of an empty
    one (`records` at or before its `seq` are passed over): a replay of last week
    without folding the year before it. It gives the state a fold from sequence 1
    gives, since a snapshot at S is `fold(log[:S])`; choose one not past the point
    asked (`gpuloom.audit.proofs.newest_trusted`).
    """
    state = start if start is not None else ClusterState()
    begin = state.seq
    for record in records:
        if record.seq <= begin:
            continue
        if seq is not None and record.seq > seq:
            break
        if at is not None and record.envelope.at > at:
            break
        apply(state, record)
    return state


@dataclass(frozen=True)
class Snapshot:
    """What `gpuloom replay` shows: nodes with GPUs, pools and holders; the queue."""

    seq: int
    nodes: list[dict[str, Any]]
    queue: list[dict[str, Any]]
    running: list[dict[str, Any]]

    def as_json(self) -> dict[str, Any]:
        return {"seq": self.seq, "nodes": self.nodes, "queue": self.queue, "running": self.running}


def snapshot(state: ClusterState) -> Snapshot:
    nodes = []
    for name in sorted(state.nodes):
        node = state.nodes[name]
        nodes.append(
            {
                "name": name,
                "state": node.phase,
                "lends_remote_vgpu": node.spec.lends_remote_vgpu,
                "gpus": [
                    {
                        "index": gpu.index,
                        "model": gpu.model,
                        "pool": gpu.pool,
                        "milli_allocated": gpu.milli_used,
                        "memory_allocated_mib": gpu.memory_used,
                        "holders": {job: list(held) for job, held in sorted(gpu.holders.items())},
                    }
                    for _, gpu in sorted(node.gpus.items())
                ],
            }
        )
    queue = [
        {"id": job.job_id, "priority": job.priority, "gpus": job.spec.gpus, "user": job.spec.user}
        for job in queue_order(state)
    ]
    running = [
        {
            "id": job.job_id,
            "state": job.phase,
            "node": job.node,
            "gpus": list(job.gpu_indexes),
            "priority": job.priority,
        }
        for job in sorted(state.jobs.values(), key=lambda j: j.order)
        if job.phase in ("placed", "running")
    ]
    return Snapshot(state.seq, nodes, queue, running)

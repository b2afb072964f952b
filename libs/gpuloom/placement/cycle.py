"""One placement cycle: place pending jobs in queue order with one policy.

The cycle is a pure function of the folded state. Its decisions record the
sequence the state was folded to (`basis_seq`) and their position in the
cycle, so that `fold(log[:basis_seq])` and the same policy reproduce them.
"""

from __future__ import annotations

from gpuloom.decide import Decision
from gpuloom.decide.queueing import queue_order
from gpuloom.events import JobPlaced, PolicyRef
from gpuloom.placement.policy import FreeGpu, NodeView, Policy, Request
from gpuloom.state import ClusterState


def node_views(state: ClusterState) -> list[NodeView]:
    """Ready nodes with their free GPUs, sorted by node name and GPU index."""
    views = []
    for name in sorted(state.nodes):
        node = state.nodes[name]
        if node.phase != "ready":
            continue
        free = [
            FreeGpu(gpu.index, gpu.uuid, gpu.model)
            for _, gpu in sorted(node.gpus.items())
            if gpu.job_id is None
        ]
        views.append(NodeView(name=name, total_gpus=len(node.gpus), free=free))
    return views


def placement_cycle(state: ClusterState, policy: Policy, limit: int = 10_000) -> list[Decision]:
    """Place as many queued jobs as fit, in queue order; a job that does not fit is skipped."""
    views = node_views(state)
    if not views:
        return []
    ref = PolicyRef(name=policy.name, version=policy.version, params=dict(policy.params))
    most_free = max(len(view.free) for view in views)
    decisions: list[Decision] = []
    for job in queue_order(state):
        if len(decisions) >= limit:
            break
        if job.spec.gpus > most_free:
            continue
        choice = policy.choose(Request(job.spec.gpus, tuple(job.spec.gpu_model)), views)
        if choice is None:
            continue
        view = next(v for v in views if v.name == choice.node)
        taken = {gpu.index for gpu in choice.gpus}
        view.free = [gpu for gpu in view.free if gpu.index not in taken]
        most_free = max(len(v.free) for v in views)
        event = JobPlaced(
            job_id=job.job_id,
            attempt=job.attempt + 1,
            node=choice.node,
            gpu_indexes=[gpu.index for gpu in choice.gpus],
            gpu_uuids=[gpu.uuid for gpu in choice.gpus],
            basis_seq=state.seq,
            cycle_position=len(decisions),
            policy=ref,
        )
        decisions.append(
            Decision(event, f"{job.job_id}:placed:{event.attempt}:{state.seq}", job.last_event_id)
        )
    return decisions

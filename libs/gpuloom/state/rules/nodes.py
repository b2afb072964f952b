"""The fold's rules of nodes: registered, cordoned and uncordoned, a GPU moved between
pools, lost (its jobs requeued or cancelled) and recovered."""

from __future__ import annotations

from gpuloom.events import (
    GpuPoolChanged,
    NodeCordoned,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeRemoved,
    NodeSpec,
    NodeUncordoned,
)
from gpuloom.state import retention
from gpuloom.state.errors import Invalid
from gpuloom.state.lifecycle import require_step
from gpuloom.state.model import ClusterState, GpuState, NodeState
from gpuloom.state.rules.common import Rule, forget_placement, release, rule, set_phase, touch
from gpuloom.state.step import Step


def registration_conflict(node: str, existing: NodeState | None, spec: NodeSpec) -> str | None:
    """Why registering `spec` for `node` over `existing` is not valid now, or None when it is.

    Shared by the fold (which voids such an event) and the inventory decision
    (which must not propose one), so the two can never disagree.
    """
    indexes = [gpu.index for gpu in spec.gpus]
    if len(set(indexes)) != len(indexes):
        return f"node {node} declares a GPU index twice"
    if existing is None:
        return None
    uuids = {gpu.index: gpu.uuid for gpu in spec.gpus}
    for index, gpu in sorted(existing.gpus.items()):
        if not gpu.idle and uuids.get(index) != gpu.uuid:
            return f"GPU {node}/{index} is held by job {gpu.job_id}"
    return None


def _registered(state: ClusterState, event: NodeRegistered, step: Step) -> None:
    existing = state.nodes.get(event.node)
    conflict = registration_conflict(event.node, existing, event.spec)
    if conflict is not None:
        raise Invalid(conflict)
    overrides = existing.pool_overrides if existing is not None else {}
    gpus = {
        gpu.index: GpuState(
            gpu.index, gpu.uuid, gpu.model, gpu.memory_mib, overrides.get(gpu.index, gpu.pool)
        )
        for gpu in event.spec.gpus
    }
    if existing is not None:
        for index, gpu in existing.gpus.items():
            if index in gpus and gpus[index].uuid == gpu.uuid:
                gpus[index].holders = gpu.holders
                gpus[index].pool = gpu.pool
    state.nodes[event.node] = NodeState(
        name=event.node,
        phase="ready",
        spec=event.spec,
        gpus=gpus,
        registered_at=step.envelope.at,
        pool_overrides={i: p for i, p in overrides.items() if i in gpus},
        hosted=existing.hosted if existing is not None else {},
        cordoned=existing.cordoned if existing is not None else False,
        cordon_reason=existing.cordon_reason if existing is not None else "",
        # a failed GPU stays out of service while it is the same GPU (its UUID)
        unhealthy={
            index: fault
            for index, fault in (existing.unhealthy if existing is not None else {}).items()
            if index in gpus and gpus[index].uuid == fault.uuid
        },
    )
    step.changed_node(event.node)


def _cordoned(state: ClusterState, event: NodeCordoned, step: Step) -> None:
    node = state.nodes.get(event.node)
    if node is None:
        raise Invalid(f"node {event.node} does not exist")
    node.cordoned = True
    node.cordon_reason = event.reason
    step.changed_node(event.node)


def _uncordoned(state: ClusterState, event: NodeUncordoned, step: Step) -> None:
    node = state.nodes.get(event.node)
    if node is None or not node.cordoned:
        raise Invalid(f"node {event.node} is not cordoned")
    node.cordoned = False
    node.cordon_reason = ""
    step.changed_node(event.node)


def removal_problem(state: ClusterState, node_name: str) -> str | None:
    """Why the node may not be removed now, or None: it must exist and hold no job
    (a job placed or running there, or a slice of its GPUs lent to one elsewhere).

    Shared by the fold (which voids such an event) and the gateway (409 before it
    writes one)."""
    node = state.nodes.get(node_name)
    if node is None:
        return f"unknown node {node_name}"
    holders = sorted(
        set(state.on_node.get(node_name, ()))
        | set(node.hosted)
        | {job for gpu in node.gpus.values() for job in gpu.holders}
    )
    if holders:
        return f"node {node_name} still holds job(s) {', '.join(holders[:5])}" + (
            f" and {len(holders) - 5} more" if len(holders) > 5 else ""
        )
    return None


def _removed(state: ClusterState, event: NodeRemoved, step: Step) -> None:
    problem = removal_problem(state, event.node)
    if problem is not None:
        raise Invalid(problem)
    del state.nodes[event.node]
    state.on_node.pop(event.node, None)
    step.changed_node(event.node)


def missing_gpu(state: ClusterState, node_name: str, index: int) -> str | None:
    """Why GPU `index` of `node_name` is not there (no such node, or no such GPU on it),
    or None: what every event about one GPU checks first."""
    node = state.nodes.get(node_name)
    if node is None:
        return f"unknown node {node_name}"
    if index not in node.gpus:
        return f"node {node_name} has no GPU {index}"
    return None


def pool_change_problem(state: ClusterState, event: GpuPoolChanged) -> str | None:
    """Why `event` may not move its GPU to another pool now, or None.

    Shared by the fold (which voids such an event) and the gateway's route (which
    answers 409 before writing one), so the two can never disagree."""
    missing = missing_gpu(state, event.node, event.index)
    if missing is not None:
        return missing
    gpu = state.nodes[event.node].gpus[event.index]
    if not gpu.idle:
        return f"GPU {event.node}/{event.index} is in use by {', '.join(sorted(gpu.holders))}"
    return None


def _pool_changed(state: ClusterState, event: GpuPoolChanged, step: Step) -> None:
    problem = pool_change_problem(state, event)
    if problem is not None:
        raise Invalid(problem)
    node = state.nodes[event.node]
    gpu = node.gpus[event.index]
    step.changed_node(event.node)
    gpu.pool = event.pool
    node.pool_overrides[event.index] = event.pool


def _lost(state: ClusterState, event: NodeLost, step: Step) -> None:
    node = state.nodes.get(event.node)
    if node is None or node.phase != "ready":
        raise Invalid(f"node {event.node} is not ready")
    jobs = [state.jobs[job_id] for job_id in sorted(state.on_node.get(event.node, set()))]
    for job in jobs:  # checked before anything changes
        require_step(job, "NodeLost")
    node.phase = "lost"
    node.lost_at = step.envelope.at
    step.changed_node(event.node)
    for job in jobs:
        release(state, job, step)
        if job.cancel_requested:
            set_phase(state, job, "cancelled")
            job.reason = f"node {event.node} lost while cancelling"
            job.finished_at = step.envelope.at
        else:
            set_phase(state, job, "queued")
            job.reason = f"requeued: node {event.node} lost ({event.reason})"
        forget_placement(state, job)
        touch(state, job, step)
        retention.retire_if_done(state, job, step)


def _recovered(state: ClusterState, event: NodeRecovered, step: Step) -> None:
    node = state.nodes.get(event.node)
    if node is None or node.phase != "lost":
        raise Invalid(f"node {event.node} is not lost")
    node.phase = "ready"
    node.lost_at = None
    step.changed_node(event.node)


RULES: tuple[Rule, ...] = (
    rule(NodeRegistered, _registered),
    rule(NodeCordoned, _cordoned),
    rule(NodeUncordoned, _uncordoned),
    rule(NodeRemoved, _removed),
    rule(GpuPoolChanged, _pool_changed),
    rule(NodeLost, _lost),
    rule(NodeRecovered, _recovered),
)

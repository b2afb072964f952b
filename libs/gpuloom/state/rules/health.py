"""The fold's rules of GPU health: a GPU out of service (GpuUnhealthy) and back
(GpuHealthy). A job with a replica on a failed GPU is marked to stop (`health_stop`);
its agents stop it, and its last replica's JobFinished requeues it, expedited
(`rules.runs`)."""

from __future__ import annotations

from gpuloom.events import GpuHealthy, GpuUnhealthy
from gpuloom.state.errors import Invalid
from gpuloom.state.model import ON_NODE_PHASES, ClusterState, GpuFault
from gpuloom.state.rules.common import Rule, rule, touch
from gpuloom.state.rules.nodes import missing_gpu
from gpuloom.state.step import Step


def unhealthy_problem(state: ClusterState, event: GpuUnhealthy) -> str | None:
    """Why `event` does not apply now, or None: the GPU must exist, be the one the
    agent names (its UUID), and be in service."""
    missing = missing_gpu(state, event.node, event.index)
    if missing is not None:
        return missing
    node = state.nodes[event.node]
    gpu = node.gpus[event.index]
    if gpu.uuid != event.uuid:
        return f"GPU {event.node}/{event.index} is {gpu.uuid}, not {event.uuid}"
    if event.index in node.unhealthy:
        return f"GPU {event.node}/{event.index} is already out of service"
    return None


def resume_problem(state: ClusterState, node_name: str, index: int) -> str | None:
    """Why GPU `index` of `node_name` may not be resumed, or None. Shared by the fold
    (which voids such a GpuHealthy) and the gateway (404 or 409 before writing one)."""
    missing = missing_gpu(state, node_name, index)
    if missing is not None:
        return missing
    if index not in state.nodes[node_name].unhealthy:
        return f"GPU {node_name}/{index} is in service"
    return None


def _unhealthy(state: ClusterState, event: GpuUnhealthy, step: Step) -> None:
    problem = unhealthy_problem(state, event)
    if problem is not None:
        raise Invalid(problem)
    node = state.nodes[event.node]
    at = step.envelope.at
    fault = GpuFault(event.uuid, event.check, event.evidence, at)
    node.unhealthy[event.index] = fault
    step.changed_node(event.node)
    why = f"GPU {event.node}/{event.index} failed ({fault.text})"
    for job_id in sorted(node.gpus[event.index].holders):
        job = state.jobs.get(job_id)
        if job is None or job.phase not in ON_NODE_PHASES or job.health_stop is not None:
            continue
        job.health_stop = why
        job.health_at = at
        job.reason = f"{why}: stopping, then requeued first"
        touch(state, job, step)


def _healthy(state: ClusterState, event: GpuHealthy, step: Step) -> None:
    problem = resume_problem(state, event.node, event.index)
    if problem is not None:
        raise Invalid(problem)
    del state.nodes[event.node].unhealthy[event.index]
    step.changed_node(event.node)


RULES: tuple[Rule, ...] = (
    rule(GpuUnhealthy, _unhealthy),
    rule(GpuHealthy, _healthy),
)

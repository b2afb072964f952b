"""Admission: admit a job some registered node could run, reject the rest with a reason."""

from __future__ import annotations

from gpuloom.decide import Decision
from gpuloom.events import JobAdmitted, JobRejected, JobSpec
from gpuloom.state import ClusterState


def rejection_reason(state: ClusterState, spec: JobSpec) -> str | None:
    """Why no registered node (ready or lost: lost nodes may come back) could ever run `spec`."""
    nodes = [state.nodes[name] for name in sorted(state.nodes)]
    if not nodes:
        return "no node is registered"
    if spec.gpus == 0:
        return None
    known_models = sorted({gpu.model for node in nodes for gpu in node.gpus.values()})
    wanted = spec.gpu_model
    if wanted and not set(wanted) & set(known_models):
        return (
            f"no node has GPU model {' or '.join(wanted)} "
            f"(models in the cluster: {', '.join(known_models) or 'none'})"
        )
    largest = max(
        sum(1 for gpu in node.gpus.values() if not wanted or gpu.model in wanted) for node in nodes
    )
    if spec.gpus > largest:
        what = f"{' or '.join(wanted)} GPUs" if wanted else "GPUs"
        return f"job needs {spec.gpus} {what} but the largest node has {largest}"
    return None


def decide_admission(state: ClusterState) -> list[Decision]:
    """Answer every submitted job without a pending cancel, in submission order."""
    decisions: list[Decision] = []
    reasons: dict[tuple[int, tuple[str, ...]], str | None] = {}  # same shape, same answer
    for job_id in sorted(state.submitted, key=lambda j: state.jobs[j].submit_seq):
        job = state.jobs[job_id]
        if job.cancel_requested:
            continue  # the queue cancels it
        shape = (job.spec.gpus, tuple(job.spec.gpu_model))
        if shape not in reasons:
            reasons[shape] = rejection_reason(state, job.spec)
        reason = reasons[shape]
        event: JobAdmitted | JobRejected = (
            JobAdmitted(job_id=job_id)
            if reason is None
            else JobRejected(job_id=job_id, reason=reason)
        )
        decisions.append(Decision(event, f"{job_id}:admission", job.last_event_id))
    return decisions

"""Queue: give admitted jobs their priority and cancel pending jobs (the queue's order
is a query, `gpuloom.queueing.order`)."""

from __future__ import annotations

from gpuloom.events import Decision, JobCancelled, JobQueued, QueuePolicySet
from gpuloom.queueing.order import dependency_status
from gpuloom.state import ClusterState


def decide_queue(state: ClusterState, policy: QueuePolicySet | None = None) -> list[Decision]:
    """Queue admitted jobs, cancel what must be, and record `policy` when it changed."""
    decisions: list[Decision] = []
    current = state.queue_policy or QueuePolicySet()
    if policy is not None and policy != current:
        decisions.append(Decision(policy, f"queue-policy:{state.seq}"))
    for job_id in sorted(state.cancel_pending, key=lambda j: state.jobs[j].order):
        job = state.jobs[job_id]
        if job.phase in ("submitted", "admitted", "queued"):
            decisions.append(
                Decision(JobCancelled(job_id=job_id), f"{job_id}:cancelled", job.last_event_id)
            )
    for job_id in sorted(state.queued_with_dependencies, key=lambda j: state.jobs[j].order):
        job = state.jobs[job_id]
        if job.cancel_requested:
            continue
        status, why = dependency_status(state, job)
        if status == "never":
            decisions.append(
                Decision(
                    JobCancelled(job_id=job_id, reason=f"DependencyNeverSatisfied: {why}"),
                    f"{job_id}:cancelled",
                    job.last_event_id,
                )
            )
    for job_id in sorted(state.admitted, key=lambda j: state.jobs[j].order):
        job = state.jobs[job_id]
        if job.cancel_requested:
            continue
        decisions.append(
            Decision(
                JobQueued(job_id=job_id, priority=job.spec.priority),
                f"{job_id}:queued",
                job.last_event_id,
            )
        )
    return decisions

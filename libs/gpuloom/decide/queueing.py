"""Queue: give admitted jobs their priority and cancel pending jobs (the queue's order
is a query, `gpuloom.queueing.order`)."""

from __future__ import annotations

from gpuloom.decide.turns import ROUND, in_turns
from gpuloom.events import Decision, JobCancelled, JobQueued, QueuePolicySet, intents
from gpuloom.state import ClusterState
from gpuloom.state.dependencies import dependency_status


def decide_queue(state: ClusterState, policy: QueuePolicySet | None = None) -> list[Decision]:
    """Cancel what must be, record `policy` when it changed, and queue admitted jobs,
    users taking turns and an array's tasks with one event, as many as the round has
    room for (`decide.turns`)."""
    decisions: list[Decision] = []
    current = state.queue_policy or QueuePolicySet()
    if policy is not None and policy != current:
        decisions.append(Decision(policy, intents.queue_policy(state.seq)))
    pending = (state.jobs[j] for j in state.cancel_pending)
    cancelled = (j for j in pending if j.phase in ("submitted", "admitted", "queued"))
    for unit in in_turns(cancelled, arrays=False):  # a task's cancel is its own
        job = unit.first
        decisions.append(
            Decision(
                JobCancelled(job_id=job.job_id), intents.cancelled(job.job_id), job.last_event_id
            )
        )
    for job_id in sorted(state.queued_with_dependencies, key=lambda j: state.jobs[j].order):
        job = state.jobs[job_id]
        if job.cancel_requested:
            continue
        status, why = dependency_status(state, job.spec.depends_on)
        if status == "never":
            decisions.append(
                Decision(
                    JobCancelled(job_id=job_id, reason=f"DependencyNeverSatisfied: {why}"),
                    intents.cancelled(job_id),
                    job.last_event_id,
                )
            )
    for name, waiters in sorted(state.reservation_waiters.items()):
        if name in state.reservations:
            continue
        for job_id in sorted(waiters, key=lambda j: state.jobs[j].order):
            job = state.jobs[job_id]
            # only its own: admission rejects a submitted one, and an admitted one is
            # queued first (an array's tasks together), then cancelled
            if job.phase == "queued" and not job.cancel_requested:
                why = f"ReservationGone: reservation {name} ended or was deleted"
                decisions.append(
                    Decision(
                        JobCancelled(job_id=job_id, reason=why),
                        intents.cancelled(job_id),
                        job.last_event_id,
                    )
                )
    room = max(0, ROUND - len(decisions))
    waiting = (state.jobs[j] for j in state.admitted)
    for unit in in_turns((j for j in waiting if not j.cancel_requested), room):
        job = unit.first  # an array's tasks share its spec, so its priority
        decisions.append(
            Decision(
                JobQueued(job_id=unit.answered_id, priority=job.spec.priority),
                unit.msg_id("queued"),
                job.last_event_id,
            )
        )
    return decisions

"""The fold's rules of a job's runs: placed (every replica's host and slices), the
reservation of the blocked head, preempted, started, finished, and charged."""

from __future__ import annotations

from gpuloom.events import (
    JobFinished,
    JobPlaced,
    JobPreempted,
    JobReserved,
    JobStarted,
    UsageCharged,
)
from gpuloom.state import retention
from gpuloom.state.errors import Invalid
from gpuloom.state.lifecycle import require_step
from gpuloom.state.model import ClusterState, JobPhase, JobState, Run
from gpuloom.state.reservations import placement_refusal
from gpuloom.state.retention import known
from gpuloom.state.rules.assignment import (
    assignment_problem,
    held_milli,
    hold_replicas,
    milli_by_model,
)
from gpuloom.state.rules.common import (
    Rule,
    forget_placement,
    job_of,
    release,
    rule,
    set_phase,
    touch,
)
from gpuloom.state.rules.elastic import replica_left
from gpuloom.state.step import Step


def _placed(state: ClusterState, event: JobPlaced, step: Step) -> None:
    job = job_of(state, event.job_id)
    require_step(job, "JobPlaced")
    if job.cancel_requested:
        raise Invalid(f"job {job.job_id} has a cancel request")
    if event.attempt != job.attempt + 1:
        raise Invalid(f"attempt {event.attempt} but job {job.job_id} is at {job.attempt}")
    replicas = event.assignments()
    problem = assignment_problem(state, job.spec, replicas)
    if problem is None and (state.reservations or job.spec.reservation is not None):
        problem = placement_refusal(state, job, replicas, step.envelope.at)
    if problem is not None:
        raise Invalid(problem)
    first = replicas[0]
    local = [piece for piece in first.slices if piece.node == first.host]
    if event.node != first.host or event.gpu_indexes != [p.index for p in local]:
        raise Invalid("node and gpu_indexes must be replica 0's host and its local GPUs")
    hold_replicas(state, job, replicas, step)
    job.attempt = event.attempt
    job.node = event.node
    job.gpu_indexes = tuple(event.gpu_indexes)
    job.gpu_uuids = tuple(event.gpu_uuids)
    job.replicas = tuple(replicas)
    job.started_replicas = set()
    job.finished_replicas = {}
    job.master = None
    job.reason = None
    job.placed_at = step.envelope.at
    job.placed_seq = step.seq
    job.yields_to = None
    job.expedited = False
    state.fair_clock = max(state.fair_clock, job.queue_tag)
    if state.reservation is not None and state.reservation.job_id == job.job_id:
        state.reservation = None
    set_phase(state, job, "placed")
    touch(state, job, step)


def _reserved(state: ClusterState, event: JobReserved, step: Step) -> None:
    job = job_of(state, event.job_id)
    require_step(job, "JobReserved")
    state.reservation = event
    touch(state, job, step)


def _preempted(state: ClusterState, event: JobPreempted, step: Step) -> None:
    job = job_of(state, event.job_id)
    require_step(job, "JobPreempted")
    if event.attempt != job.attempt:
        raise Invalid(f"attempt {event.attempt} is not job {job.job_id}'s current {job.attempt}")
    if job.preempted_by is not None:
        raise Invalid(f"job {job.job_id} is already preempted by {job.preempted_by}")
    if not known(state, event.by):
        raise Invalid(f"preempting job {event.by} does not exist")
    job.preempted_by = event.by
    job.preempted_at = step.envelope.at
    job.reason = f"Preempted by {event.by} ({event.reason}): stopping, then requeued"
    touch(state, job, step)


def _require_current_attempt(job: JobState, attempt: int, node: str, replica: int) -> None:
    if attempt != job.attempt:
        raise Invalid(f"attempt {attempt} is not job {job.job_id}'s current attempt {job.attempt}")
    if replica >= len(job.replicas) or job.replicas[replica].host != node:
        raise Invalid(f"replica {replica} of job {job.job_id} is not hosted on {node}")


def _started(state: ClusterState, event: JobStarted, step: Step) -> None:
    job = job_of(state, event.job_id)
    require_step(job, "JobStarted")
    _require_current_attempt(job, event.attempt, event.node, event.replica)
    if event.replica in job.started_replicas or event.replica in job.finished_replicas:
        raise Invalid(f"replica {event.replica} of job {job.job_id} already started")
    job.started_replicas.add(event.replica)
    if event.master_addr is not None and event.master_port is not None:
        job.master = (event.master_addr, event.master_port)
    if job.phase == "placed":
        job.runs.append(
            Run(
                attempt=event.attempt,
                node=event.node,
                gpus=job.spec.gpus * len(job.held_replicas()),
                started_at=step.envelope.at,
                gpu_milli=held_milli(job),
                milli_by_model=milli_by_model(state, job),
            )
        )
        if job.started_at is None:
            job.started_at = step.envelope.at
        set_phase(state, job, "running")
    touch(state, job, step)


#: When replicas end differently, the job ends as the first of these any replica had.
_OUTCOME_ORDER = ("cancelled", "preempted", "timed_out", "failed", "succeeded")
#: The final phase of each outcome a run can end with (a preempted run is requeued, or
#: cancelled when a cancel request waits).
_ENDED_AS: dict[str, JobPhase] = {
    "succeeded": "succeeded",
    "failed": "failed",
    "timed_out": "timed_out",
    "cancelled": "cancelled",
}


def _finished(state: ClusterState, event: JobFinished, step: Step) -> None:
    job = job_of(state, event.job_id)
    require_step(job, "JobFinished")
    _require_current_attempt(job, event.attempt, event.node, event.replica)
    if event.replica in job.finished_replicas:
        raise Invalid(f"replica {event.replica} of job {job.job_id} already finished")
    if event.replica in job.leaving:  # an elastic gang shrinks: the rest runs on
        replica_left(state, job, event, step)
    elif event.outcome == "preempted" and job.preempted_by is None and job.health_stop is None:
        raise Invalid(f"job {job.job_id} was not preempted, nor on a failed GPU")
    job.finished_replicas[event.replica] = (event.outcome, event.exit_code, event.reason)
    touch(state, job, step)
    if len(job.finished_replicas) < len(job.replicas):
        return
    left = job.left
    ends = [job.finished_replicas[r] for r in sorted(job.finished_replicas) if r not in left]
    outcome = min((end[0] for end in ends), key=_OUTCOME_ORDER.index)
    first_bad = next((end for end in ends if end[0] == outcome), ends[0])
    # A gang's run ends with its last replica, which need not be the last reported:
    # only a single replica's own end time is the run's end.
    ended = event.ended_at if len(job.replicas) == 1 else None
    if job.health_at is not None:  # a failed GPU: the run is charged up to the fault
        ended = job.health_at if ended is None else min(ended, job.health_at)
    release(state, job, step, ended)
    if outcome == "preempted" and job.health_stop is not None and not job.cancel_requested:
        why = job.health_stop
        job.requeues += 1
        job.expedited = True
        job.yields_to = None
        set_phase(state, job, "queued")
        forget_placement(state, job)
        job.reason = f"requeued first: {why}"
        return
    if outcome == "preempted" and not job.cancel_requested:
        by = job.preempted_by
        job.yields_to = by  # before it is queued: `set_phase` files it among the yielding
        set_phase(state, job, "queued")
        forget_placement(state, job)
        job.reason = f"requeued: preempted by {by}"
        return
    if outcome == "preempted":
        outcome, first_bad = "cancelled", ("cancelled", first_bad[1], "cancelled while preempted")
    set_phase(state, job, _ENDED_AS[outcome])
    job.exit_code = first_bad[1]
    job.reason = first_bad[2]
    job.finished_at = step.envelope.at
    retention.retire_if_done(state, job, step)


def _charged(state: ClusterState, event: UsageCharged, step: Step) -> None:
    job = job_of(state, event.job_id)
    require_step(job, "UsageCharged")
    runs = [run for run in job.runs if run.attempt == event.attempt]
    if not runs:
        raise Invalid(f"job {job.job_id} has no run for attempt {event.attempt}")
    run = runs[-1]
    if event.attempt in job.charged_attempts:
        raise Invalid(f"attempt {event.attempt} of job {job.job_id} already charged")
    if event.part != run.charges:
        raise Invalid(f"charge part {event.part}, but attempt {event.attempt} has {run.charges}")
    if event.period_end is None:
        if run.ended_at is None:
            raise Invalid(f"attempt {event.attempt} of job {job.job_id} has not ended")
        job.charged_attempts.append(event.attempt)
        if all(r.attempt in job.charged_attempts for r in job.runs if r.ended_at is not None):
            state.uncharged.discard(job.job_id)
    else:
        since = run.charged_until or run.started_at
        if event.period_end <= since:
            raise Invalid(f"interim charge up to {event.period_end} does not pass {since}")
        run.charged_until = event.period_end
    run.charges += 1
    run.charged_milli_seconds += event.gpu_milli_seconds
    for model, amount in event.by_model.items():
        run.charged_by_model[model] = run.charged_by_model.get(model, 0) + amount
    account, user = job.spec.account, job.spec.user
    state.usage_by_account[account] = (
        state.usage_by_account.get(account, 0) + event.gpu_milli_seconds
    )
    state.usage_by_user[user] = state.usage_by_user.get(user, 0) + event.gpu_milli_seconds
    touch(state, job, step)
    retention.retire_if_done(state, job, step)


RULES: tuple[Rule, ...] = (
    rule(JobPlaced, _placed),
    rule(JobReserved, _reserved),
    rule(JobPreempted, _preempted),
    rule(JobStarted, _started),
    rule(JobFinished, _finished),
    rule(UsageCharged, _charged),
)

"""The fold's rules of a job's way to the queue: submitted (alone or in an array),
admitted or rejected, queued, and cancelled before it runs."""

from __future__ import annotations

from gpuloom.events import (
    JobAdmitted,
    JobArraySubmitted,
    JobCancelled,
    JobCancelRequested,
    JobQueued,
    JobRejected,
    JobSpec,
    JobSubmitted,
)
from gpuloom.state import retention
from gpuloom.state.errors import Invalid
from gpuloom.state.lifecycle import LIFECYCLE, require_step
from gpuloom.state.model import ClusterState, JobState
from gpuloom.state.retention import known, spec_submitted, task_added
from gpuloom.state.rules.common import (
    Rule,
    count_live,
    job_of,
    release,
    rule,
    set_phase,
    touch,
    waiting_for,
)
from gpuloom.state.step import Step


def _submitted(state: ClusterState, event: JobSubmitted, step: Step) -> None:
    if known(state, event.job_id) or event.job_id in state.arrays:
        raise Invalid(f"job {event.job_id} already submitted")
    key = event.idempotency_key
    if key is not None and key in state.idempotency_keys:
        raise Invalid(f"idempotency key already used by job {state.idempotency_keys[key]}")
    _add_job(state, event.job_id, event.spec, step, key, event.array_id, event.array_index)
    if event.array_id is not None and event.array_index is not None:
        tasks = state.arrays.get(event.array_id, 0)
        state.arrays[event.array_id] = max(tasks, event.array_index + 1)
        task_added(state, event.array_id)


def _array_submitted(state: ClusterState, event: JobArraySubmitted, step: Step) -> None:
    """Every task at once, or (voided) none."""
    if known(state, event.job_id) or event.job_id in state.arrays:
        raise Invalid(f"job {event.job_id} already submitted")
    key = event.idempotency_key
    if key is not None and key in state.idempotency_keys:
        raise Invalid(f"idempotency key already used by job {state.idempotency_keys[key]}")
    tasks = event.task_ids()
    taken = [task for task in tasks if known(state, task)]
    if taken:
        raise Invalid(f"task {taken[0]} already submitted")
    task_spec = event.spec.model_copy(update={"array": None})
    for index, task in enumerate(tasks):
        _add_job(state, task, task_spec, step, None, event.job_id, index)
        task_added(state, event.job_id, key)
    state.arrays[event.job_id] = len(tasks)
    if key is not None:
        state.idempotency_keys[key] = event.job_id


def _add_job(
    state: ClusterState,
    job_id: str,
    spec: JobSpec,
    step: Step,
    key: str | None,
    array_id: str | None,
    array_index: int | None,
) -> None:
    job = JobState(
        job_id=job_id,
        spec=spec,
        phase="submitted",
        submitted_at=step.envelope.at,
        submit_seq=step.seq,
        idempotency_key=key,
        priority=spec.priority,
        array_id=array_id,
        array_index=array_index,
    )
    state.jobs[job_id] = job
    state.submitted.add(job_id)
    count_live(state, job, +1)
    for dependency in spec.depends_on:
        state.dependents.setdefault(dependency.job, set()).add(job_id)
    if spec.reservation is not None:
        waiting_for(state, job_id, spec.reservation, True)
    if key is not None:
        state.idempotency_keys[key] = job_id
    spec_submitted(state, job)
    touch(state, job, step)


def jobs_in(state: ClusterState, job_id: str, event_type: str) -> list[JobState]:
    """The job `job_id`, which `event_type` must find where it is (`LIFECYCLE`); or, for
    an array's own id, every task of the array it may find, by index (at least one):
    admission and the queue answer an array's waiting tasks with one event, as a cancel
    request does."""
    if job_id not in state.jobs and job_id in state.arrays:
        source = LIFECYCLE[event_type].source
        tasks = (state.jobs.get(task) for task in state.array_tasks(job_id))
        found = [job for job in tasks if job is not None and job.phase in source]
        if not found:
            raise Invalid(f"no task of array {job_id} is {'/'.join(source)}")
        return found
    job = job_of(state, job_id)
    require_step(job, event_type)
    return [job]


def _admitted(state: ClusterState, event: JobAdmitted, step: Step) -> None:
    for job in jobs_in(state, event.job_id, "JobAdmitted"):
        set_phase(state, job, "admitted")
        touch(state, job, step)


def _rejected(state: ClusterState, event: JobRejected, step: Step) -> None:
    for job in jobs_in(state, event.job_id, "JobRejected"):
        set_phase(state, job, "rejected")
        job.reason = event.reason
        job.finished_at = step.envelope.at
        touch(state, job, step)
        retention.retire_if_done(state, job, step)


def _queued(state: ClusterState, event: JobQueued, step: Step) -> None:
    for job in jobs_in(state, event.job_id, "JobQueued"):
        job.priority = event.priority
        job.queue_tag = fair_tag(state, job.spec.user)
        set_phase(state, job, "queued")
        touch(state, job, step)


#: Users' tags kept before those at or below the clock are forgotten.
USER_TAGS_KEPT = 64


def fair_tag(state: ClusterState, user: str) -> int:
    """The tag of `user`'s job queued now (start-time fair queuing): one past the
    later of the clock (the highest tag placed so far) and the user's last tag. A
    user with a backlog gets tags far ahead of the clock; one with none gets the
    clock's next, so their job passes the backlog of others (at equal priority,
    where the log's policy asks for fair queuing: `QueuePolicySet.fair_queuing`)."""
    tags = state.user_tags
    tag = max(state.fair_clock, tags.pop(user, 0)) + 1
    tags[user] = tag
    if len(tags) > USER_TAGS_KEPT:  # a tag at or below the clock is the clock's
        for name in [name for name, kept in tags.items() if kept <= state.fair_clock]:
            del tags[name]
    return tag


def _cancel_requested(state: ClusterState, event: JobCancelRequested, step: Step) -> None:
    if event.job_id not in state.jobs and event.job_id in state.arrays:
        _cancel_array(state, event.job_id, step)
        return
    job = job_of(state, event.job_id)
    if job.is_final:
        raise Invalid(f"job {job.job_id} already {job.phase}")
    require_step(job, "JobCancelRequested")
    _request_cancel(state, job, step)


def _cancel_array(state: ClusterState, array_id: str, step: Step) -> None:
    """`scancel <array id>`: every task that has not ended (voided if none is left)."""
    tasks = (state.jobs.get(task) for task in state.array_tasks(array_id))
    live = [job for job in tasks if job is not None and not job.is_final]
    if not live:
        raise Invalid(f"every task of array {array_id} has ended")
    for job in live:
        _request_cancel(state, job, step)


def _request_cancel(state: ClusterState, job: JobState, step: Step) -> None:
    job.cancel_requested = True
    if job.phase not in ("placed", "running"):
        state.cancel_pending.add(job.job_id)
    touch(state, job, step)


def _cancelled(state: ClusterState, event: JobCancelled, step: Step) -> None:
    job = job_of(state, event.job_id)
    require_step(job, "JobCancelled")
    release(state, job, step)
    set_phase(state, job, "cancelled")
    job.reason = event.reason
    job.finished_at = step.envelope.at
    touch(state, job, step)
    retention.retire_if_done(state, job, step)


RULES: tuple[Rule, ...] = (
    rule(JobSubmitted, _submitted),
    rule(JobArraySubmitted, _array_submitted),
    rule(JobAdmitted, _admitted),
    rule(JobRejected, _rejected),
    rule(JobQueued, _queued),
    rule(JobCancelRequested, _cancel_requested),
    rule(JobCancelled, _cancelled),
)

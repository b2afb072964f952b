"""What the folded state keeps of jobs that ended: the rules that bound it.

The state holds what decisions need, so its size follows the live cluster, not the
log's history (docs/architecture.md, "What the state keeps"):

- A job leaves `ClusterState.jobs` at the end of the event that made it final *and*
  charged (no attempt in `uncharged`): nothing can change it any more (every later
  event about it is voided, as before), and accounting has billed it. What stays is
  a `Tombstone` (phase, end, owner, array, idempotency key) for `RETENTION`.
- Within `RETENTION`, a tombstone answers as the job would have: a dependency on it
  is met or never by its recorded phase, a resubmission of its id is voided, its
  idempotency key still names it, a late event about it is voided.
- After `RETENTION` (measured on the log's clock, `state.clock`), the tombstone, the
  job's idempotency key, and an array whose every task has expired are dropped. A
  dependency on such a job is refused as unknown (`dependency_unknown`), and a key
  may be used again.

Deterministic and cheap: tombstones expire from the front of `retired`, a list in
the order jobs left (their times never decrease: the log's clock is monotone), so
each event costs amortised O(1) and nothing depends on set or dict order.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpuloom.state.model import RECENT_SPECS_KEPT, ClusterState, JobState, Tombstone
from gpuloom.state.step import Step

#: How long the state remembers a job that ended and was charged: a week.
#: Slurm forgets an ended job after MinJobAge (300 s) but answers later questions
#: from its accounting database; gpuloom's decisions read only the fold, so the
#: window must outlast what a client or a pipeline plausibly refers back to: a
#: dependency on last night's (or last weekend's) job, an idempotent retry after an
#: outage (Stripe keeps keys 24 h). At 10,000 jobs a day that is 70,000 tombstones
#: of a few hundred bytes each: tens of MiB at the very most, bounded whatever the age.
RETENTION = timedelta(days=7)

#: Compact `retired` once this many expired entries lead it (amortised O(1)).
_COMPACT_AFTER = 1024


def retire_if_done(state: ClusterState, job: JobState, step: Step) -> None:
    """Forget `job` if it is final and fully charged (leaving is a change of the job).

    Called by the fold at the end of every rule that can make a job final or charged
    (JobRejected, JobCancelled, JobFinished, UsageCharged, NodeLost), so a job
    leaves at a point the log defines, the same in every service.
    """
    if step.keep_history or not job.is_final or job.job_id in state.uncharged:
        return
    job_id, at = job.job_id, step.envelope.at
    del state.jobs[job_id]
    step.changed_job(job_id)
    state.tombstones[job_id] = Tombstone(
        phase=job.phase,
        ended_at=job.finished_at or at,
        user=job.spec.user,
        account=job.spec.account,
        array_id=job.array_id,
        idempotency_key=job.idempotency_key,
        placed_at=job.placed_at,
        reason=job.reason if job.phase == "rejected" else None,
    )
    since = at if state.clock is None else max(state.clock, at)
    state.retired.append((since, job_id))
    state.forgotten_by_phase[job.phase] = state.forgotten_by_phase.get(job.phase, 0) + 1
    state.forgotten_attempts += job.attempt
    for dependency in job.spec.depends_on:
        waiting = state.dependents.get(dependency.job)
        if waiting is not None:
            waiting.discard(job_id)
            if not waiting:
                del state.dependents[dependency.job]
    if state.reservation is not None and state.reservation.job_id == job_id:
        state.reservation = None  # its job will never be queued again


def expire(state: ClusterState) -> None:
    """Drop the tombstones (and their keys and arrays) older than RETENTION on the log's
    clock, but for one a live job still depends on (its outcome decides that job)."""
    clock = state.clock
    if clock is None:
        return
    retired = state.retired
    head = state.retired_head
    while head < len(retired) and clock - retired[head][0] > RETENTION:
        left, job_id = retired[head]
        head += 1
        if _awaited(state, job_id, left + RETENTION):  # its outcome still decides a job:
            retired.append((clock, job_id))  # kept, looked at again a window later
            continue
        tombstone = state.tombstones.pop(job_id, None)
        if tombstone is None:
            continue
        key = tombstone.idempotency_key
        if key is not None and state.idempotency_keys.get(key) == job_id:
            del state.idempotency_keys[key]
        if tombstone.array_id is not None:
            _task_expired(state, tombstone.array_id)
    if head >= _COMPACT_AFTER and 2 * head >= len(retired):
        del retired[:head]
        head = 0
    state.retired_head = head


def _awaited(state: ClusterState, job_id: str, window_end: datetime) -> bool:
    """A live job that was submitted within the window depends on `job_id`. (One
    submitted after it finds the job unknown, as documented: the answer does not depend
    on whether the tombstone happened to expire before or after that submission.)"""
    tombstone = state.tombstones.get(job_id)
    array_id = tombstone.array_id if tombstone is not None else None
    dependents = [*state.dependents.get(job_id, ())]
    if array_id is not None:  # a job that depends on the whole array awaits this task
        dependents += state.dependents.get(array_id, ())
    return any(
        (job := state.jobs.get(dependent)) is not None and job.submitted_at <= window_end
        for dependent in dependents
    )


def _task_expired(state: ClusterState, array_id: str) -> None:
    left, key = state.array_left.get(array_id, (1, None))
    if left > 1:
        state.array_left[array_id] = (left - 1, key)
        return
    state.array_left.pop(array_id, None)
    state.arrays.pop(array_id, None)
    if key is not None and state.idempotency_keys.get(key) == array_id:
        del state.idempotency_keys[key]


def task_added(state: ClusterState, array_id: str, key: str | None = None) -> None:
    """Count one more task of `array_id` that has not expired (and the array's key)."""
    left, known = state.array_left.get(array_id, (0, None))
    state.array_left[array_id] = (left + 1, key if key is not None else known)


def spec_submitted(state: ClusterState, job: JobState) -> None:
    """Remember the submission's spec (the latest RECENT_SPECS_KEPT) and its account."""
    state.job_accounts.add(job.spec.account)
    state.recent_specs.append(job.spec)
    if len(state.recent_specs) >= 2 * RECENT_SPECS_KEPT:
        del state.recent_specs[:-RECENT_SPECS_KEPT]


def known(state: ClusterState, job_id: str) -> bool:
    """Whether `job_id` names a job the state knows, live or ended within RETENTION."""
    return job_id in state.jobs or job_id in state.tombstones


def final_phase(state: ClusterState, job_id: str) -> str | None:
    """The phase of a job, live or remembered; None when the state does not know it."""
    job = state.jobs.get(job_id)
    if job is not None:
        return job.phase
    tombstone = state.tombstones.get(job_id)
    return tombstone.phase if tombstone is not None else None


def owner(state: ClusterState, job_id: str) -> tuple[str, str] | None:
    """(user, account) of a job, live or remembered; None when the state does not know it."""
    job = state.jobs.get(job_id)
    if job is not None:
        return job.spec.user, job.spec.account
    tombstone = state.tombstones.get(job_id)
    return (tombstone.user, tombstone.account) if tombstone is not None else None


def unknown_job(state: ClusterState, job_id: str) -> str:
    """Why an event about a job that is not live is invalid (the fold voids it)."""
    tombstone = state.tombstones.get(job_id)
    if tombstone is not None:
        return f"job {job_id} already {tombstone.phase} (ended and forgotten)"
    return f"unknown job {job_id}"


def dependency_unknown(job_id: str) -> str:
    """The reason a dependency on a job the state does not know is refused."""
    days = RETENTION.days
    return (
        f"depends on unknown job {job_id} (never submitted, or ended more than "
        f"{days} days ago and no longer tracked)"
    )

"""What every rule module of the fold shares: the typed rule table's entry, and the
steps rules take on a job (look it up, check and move its phase, free what it holds)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import TypeVar, cast

from gpuloom.events import Event, QueuePolicySet
from gpuloom.state.errors import Invalid
from gpuloom.state.model import ClusterState, JobPhase, JobState
from gpuloom.state.retention import unknown_job
from gpuloom.state.step import Step
from gpuloom.state.tenancy import CLUSTER_TOTAL
from gpuloom.state.usage import DecayedUsage

E = TypeVar("E", bound=Event)
#: A rule of the fold: apply one event of its type to the state, or raise `Invalid`.
Handler = Callable[[ClusterState, Event, Step], None]
Rule = tuple[type[Event], Handler]


def rule(kind: type[E], handler: Callable[[ClusterState, E, Step], None]) -> Rule:
    """The table entry of `handler`, the rule for events of type `kind`: typed here once
    (mypy checks that the handler takes that type), dispatched by exact type in `apply`."""
    return kind, cast(Handler, handler)


def job_of(state: ClusterState, job_id: str) -> JobState:
    job = state.jobs.get(job_id)
    if job is None:
        raise Invalid(unknown_job(state, job_id))
    return job


def set_phase(state: ClusterState, job: JobState, phase: JobPhase) -> None:
    """Move a job to `phase`, keeping the work-list indexes in step."""
    old = job.phase
    for index, member in (
        (state.submitted, "submitted"),
        (state.admitted, "admitted"),
        (state.queued, "queued"),
        (state.placed, "placed"),
    ):
        if old == member:
            index.discard(job.job_id)
        if phase == member:
            index.add(job.job_id)
    for subset, belongs in (
        (state.queued_with_dependencies, bool(job.spec.depends_on)),
        (state.queued_yielding, job.yields_to is not None),
    ):
        if phase == "queued" and belongs:
            subset.add(job.job_id)
        else:
            subset.discard(job.job_id)
    if old in ("placed", "running") and phase not in ("placed", "running"):
        for name in job.nodes_held():
            state.on_node.get(name, set()).discard(job.job_id)
    if phase in ("placed", "running"):
        for name in job.nodes_held():
            state.on_node.setdefault(name, set()).add(job.job_id)
    if phase in ("placed", "running") and job.spec.elastic:
        state.elastic.add(job.job_id)
    else:
        state.elastic.discard(job.job_id)
    was_final = job.is_final
    job.phase = phase
    if job.is_final and not was_final:
        count_live(state, job, -1)
    if job.is_final or phase in ("placed", "running"):
        state.cancel_pending.discard(job.job_id)
    if job.spec.reservation is not None:
        waiting_for(state, job.job_id, job.spec.reservation, phase in PENDING_PHASES)


#: A job waits in these phases (for a reservation, among others).
PENDING_PHASES = ("submitted", "admitted", "queued")


def waiting_for(state: ClusterState, job_id: str, reservation: str, waits: bool) -> None:
    """Keep `state.reservation_waiters` in step: whether `job_id` waits in `reservation`."""
    waiters = state.reservation_waiters
    if waits:
        waiters.setdefault(reservation, set()).add(job_id)
        return
    held = waiters.get(reservation)
    if held is not None:
        held.discard(job_id)
        if not held:
            del waiters[reservation]


def count_live(state: ClusterState, job: JobState, change: int) -> None:
    """Add `change` to the live jobs of the job's user, account and the cluster."""
    live = state.live_jobs
    for identity in (("user", job.spec.user), ("account", job.spec.account), CLUSTER_TOTAL):
        left = live.get(identity, 0) + change
        if left:
            live[identity] = left
        else:
            live.pop(identity, None)


def touch(state: ClusterState, job: JobState, step: Step) -> None:
    """The event changed `job`: stamp it with the event, and say so on the step."""
    job.last_event_id = step.envelope.id
    job.last_seq = step.seq
    step.changed_job(job.job_id)


def release(state: ClusterState, job: JobState, step: Step, ended: datetime | None = None) -> None:
    """Free everything the job's placement holds and close its running run, if any.

    The run ends at the event's time, or at `ended`, when the process really
    ended as its node saw it (reported late when the agent was down). `ended` is a
    node's claim, so it is kept within what the log knows: not after the event (no run
    is charged past its report) and not before the run's start, nor before an
    interim charge already billed (charges are never taken back, and the run's
    charges must add up to its time)."""
    for name in job.nodes_held():
        node = state.nodes.get(name)
        if node is None:
            continue
        step.changed_node(name)
        node.hosted.pop(job.job_id, None)
        for gpu in node.gpus.values():
            gpu.holders.pop(job.job_id, None)
    run = job.current_run()
    if run is not None:
        at = step.envelope.at
        end = at
        if ended is not None and ended.utcoffset() is not None:
            end = min(max(ended, run.charged_until or run.started_at), at)
        end = max(end, run.rate_since or run.started_at)  # what was banked stays charged
        run.ended_at = end
        state.uncharged.add(job.job_id)
        add_fair_share_usage(state, job.spec.account, run.gpu_milli_seconds(), end)


def add_fair_share_usage(state: ClusterState, account: str, amount: int, at: datetime) -> None:
    """Fair share counts a run's GPU time when it ends (the charge event comes later, from
    another service: the next placement cycle must not see the account as idle meanwhile)."""
    half_life = (state.queue_policy or QueuePolicySet()).fair_share_half_life_s
    usage = state.decayed_usage.setdefault(account, DecayedUsage(half_life))
    usage.add(amount, max(usage.at, at.timestamp()))


def forget_placement(state: ClusterState, job: JobState) -> None:
    """After `release` and the phase change: the job holds nothing anywhere."""
    job.node = None
    job.gpu_indexes = ()
    job.gpu_uuids = ()
    job.replicas = ()
    job.started_replicas = set()
    job.finished_replicas = {}
    job.master = None
    job.leaving = set()
    job.shrink_by = None
    job.left = set()
    job.preempted_by = None
    job.preempted_at = None
    job.health_stop = None
    job.health_at = None

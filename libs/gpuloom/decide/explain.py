"""Why is my job pending? A pure reading of the folded state.

For a pending job: a reason code, its position in the queue and the jobs ahead
of it, for every node the first rule that keeps the job off it, and an
estimate of when it could start, from the time limits of the jobs running now.

Reason codes: `Dependency` (a job it depends on has not ended), `QuotaExceeded`
(its account's quota, with what it may borrow, has no room), `AssocGrpGRES` (its
user or account holds as many GPUs as its `max_gpus` allows), `Resources`
(no node has room now; for the job holding the backfill reservation, when it
is to start), `Reservation` (a node has room now, but the job would run past
the start of the job ahead that holds the reservation, on what it reserved),
`Priority` (a node has room, jobs ahead come first or the next placement cycle
has not run yet), `Held` (a cancel is pending).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import datetime

from gpuloom.events import QueuePolicySet
from gpuloom.events.accounts import depends_on_where, model_resource, pool_resource
from gpuloom.placement.cycle import earliest_start
from gpuloom.placement.engine import Policy
from gpuloom.placement.filters import FITS, verdict
from gpuloom.placement.inputs import current_reservation, from_ms, node_views, request_of
from gpuloom.placement.policies import BestFit
from gpuloom.placement.resources import NodeView, fits_locally
from gpuloom.queueing.order import (
    gpu_demand,
    queue_order,
    quota_book,
    upfront_demand,
    yields_to,
)
from gpuloom.queueing.quota import QuotaBook
from gpuloom.state import ClusterState, JobState
from gpuloom.state.dependencies import dependency_status

AHEAD_SHOWN = 20


@dataclass(frozen=True)
class Explanation:
    job_id: str
    state: str
    reason: str | None
    detail: str | None = None
    position: int | None = None
    ahead: list[str] = field(default_factory=list)
    nodes: dict[str, str] = field(default_factory=dict)
    estimated_start: datetime | None = None


def _model_quota_refusal(state: ClusterState, job: JobState, book: QuotaBook) -> str | None:
    """A refusal when every GPU model (and pool) the job could land on is over quota.

    Model and pool quotas are checked once a placement is known; a job that no
    allowed model's quota admits is held by them however much room there is.
    """
    demand = gpu_demand(job)
    if not demand or not any(depends_on_where(r) for r in book.trackers):
        return None
    places = sorted(
        {
            (gpu.model, gpu.pool)
            for node in state.nodes.values()
            for gpu in node.gpus.values()
            if not job.spec.gpu_model or gpu.model in job.spec.gpu_model
        }
    )
    reasons = []
    for model, pool in places:
        why = book.why_not(
            job.spec.account, {model_resource(model): demand, pool_resource(pool): demand}
        )
        if why is None:
            return None
        reasons.append(why)
    return reasons[0] if reasons else None


@dataclass
class Shared:
    """What briefly explaining many jobs of one state shares, computed once on first use
    (the job list explains each pending job of its page)."""

    state: ClusterState
    _book: QuotaBook | None = None
    _views: list[NodeView] | None = None

    @property
    def book(self) -> QuotaBook:
        if self._book is None:
            self._book = quota_book(self.state)
        return self._book

    @property
    def views(self) -> list[NodeView]:
        if self._views is None:
            self._views = list(node_views(self.state))
        return self._views


def reason_text(code: str | None, detail: str | None) -> str | None:
    """`Code: detail`, with the code once: a detail that already starts with its code
    (`Dependency: waiting for ...`) is shown as it is."""
    if code is None:
        return detail
    if not detail:
        return code
    return detail if detail.startswith(code) else f"{code}: {detail}"


def _brief(state: ClusterState, job: JobState, shared: Shared) -> Explanation:
    """The reason of a queued job that neither quota nor dependencies hold, without the
    queue order (a sort of the whole queue) or per-node verdicts (see `explain`).

    A job that some node could take now and that is not placed is behind the head of
    the queue: with a reservation held by another job that is `Reservation` under
    backfill, otherwise `Priority`.
    """
    reserved = current_reservation(state)
    if reserved is not None and reserved.job_id == job.job_id:
        return Explanation(job.job_id, job.phase, "Resources", "it holds the reservation")
    request = request_of(job.spec)
    if not any(fits_locally(request, view) for view in shared.views):
        return Explanation(job.job_id, job.phase, "Resources", "no node has room for it now")
    strict = (state.queue_policy or QueuePolicySet()).backfill == "off"
    if reserved is not None and not strict:
        detail = f"it would delay {reserved.job_id}, which holds the reservation"
        return Explanation(job.job_id, job.phase, "Reservation", detail)
    return Explanation(job.job_id, job.phase, "Priority", "job(s) ahead in the queue")


def explain(
    state: ClusterState,
    job_id: str,
    brief: bool = False,
    policy: Policy | None = None,
    shared: Shared | None = None,
) -> Explanation | None:
    """Why `job_id` is pending (see the module doc). `brief`: the reason code and detail
    only, cheap enough for `GET /v1/jobs/{id}`, which clients poll (`_brief`).

    Each node's verdict is the placement filters' (`gpuloom.placement.filters`) and
    the estimate the scheduler's reservation search (`earliest_start`) with `policy`
    (default best fit: which nodes it picks, not whether the job fits, depends on it)."""
    job = state.jobs.get(job_id)
    if job is None:
        ended = state.tombstones.get(job_id)  # ended and forgotten (retention.py)
        return Explanation(job_id, ended.phase, None, None) if ended is not None else None
    if job.phase not in ("submitted", "admitted", "queued"):
        return Explanation(job_id, job.phase, None, job.reason)
    if job.cancel_requested:
        return Explanation(job_id, job.phase, "Held", "a cancel request is being carried out")
    if job.spec.depends_on:
        status, why = dependency_status(state, job.spec.depends_on)
        if status != "met":
            return Explanation(job_id, job.phase, "Dependency", why)
    if job.phase != "queued":
        return Explanation(job_id, job.phase, "Priority", "admission and queueing are pending")
    shared = shared if shared is not None and shared.state is state else Shared(state)
    book = shared.book
    held = book.why_not(job.spec.account, upfront_demand(job.spec), job.spec.user)
    if held is None:
        held = _model_quota_refusal(state, job, book)
    if held is not None:  # "QuotaExceeded: ..." or "AssocGrpGRES: ..." (max_gpus)
        return Explanation(job_id, job.phase, held.partition(":")[0], held)
    if brief:
        return _yielding(state, job, _brief(state, job, shared))
    order = [j.job_id for j in queue_order(state)]
    position = order.index(job_id) + 1 if job_id in order else None
    ahead = order[: (position or 1) - 1][:AHEAD_SHOWN]
    request = request_of(job.spec)
    current = {v.name: v for v in node_views(state, include_lost=True)}
    idle = {v.name: v for v in node_views(state, idle=True, include_lost=True)}
    verdicts = {
        name: verdict(
            request,
            current[name],
            idle[name],
            ready=state.nodes[name].phase == "ready",
            cordoned=state.nodes[name].cordon_reason if state.nodes[name].cordoned else None,
        )
        for name in sorted(current)
    }
    reserved = current_reservation(state)
    estimate: datetime | None = None
    if reserved is not None and reserved.job_id == job_id:
        reason, detail = "Resources", "no node has room for it now; it holds the reservation"
        if reserved.start_at is not None:
            estimate = from_ms(reserved.start_at)
            detail += f" to start at {estimate.isoformat()}"
        else:
            detail += " until jobs without a time limit end"
    elif any(v == FITS for v in verdicts.values()):
        strict = (state.queue_policy or QueuePolicySet()).backfill == "off"
        if strict and ahead:
            reason = "Priority"
            detail = (
                f"{len(ahead)} job(s) ahead in the queue, and nothing passes them (backfill off)"
            )
        elif reserved is not None and reserved.job_id in order[: (position or 1) - 1]:
            hosts = sorted({r.host for r in reserved.replicas})
            reason = "Reservation"
            detail = (
                f"it would delay {reserved.job_id}, which is reserved "
                + (
                    f"to start at {from_ms(reserved.start_at).isoformat()}"
                    if reserved.start_at is not None
                    else "until jobs without a time limit end"
                )
                + f" on {', '.join(hosts)}; a time limit that ends before then lets it backfill"
            )
        else:
            reason, detail = "Priority", f"{len(ahead)} job(s) ahead in the queue"
            depth = (state.queue_policy or QueuePolicySet()).backfill_depth
            if depth is not None and position is not None and position > depth + 1:
                detail += (
                    f"; a placement pass tries at most {depth} jobs behind the first that"
                    " cannot start (backfill depth), and this one may be further back"
                )
    else:
        reason, detail = "Resources", "no node has room for it now"
    if reason == "Resources" and estimate is None:
        estimate = earliest_start(state, job, policy or BestFit())
    found = Explanation(job_id, job.phase, reason, detail, position, ahead, verdicts, estimate)
    return _yielding(state, job, found)


def _yielding(state: ClusterState, job: JobState, found: Explanation) -> Explanation:
    """`found`, saying also that the job ranks behind the job it was preempted for
    (`QueuePolicySet.victims_yield`), while that one waits: its points alone would
    not explain its place."""
    preemptor = yields_to(state, job)
    if preemptor is None:
        return found
    said = f"it yields to {preemptor}, which it was preempted for and which goes first"
    return replace(found, detail=f"{found.detail}; {said}" if found.detail else said)

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

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuloom.events import QueuePolicySet
from gpuloom.placement.cycle import current_reservation, from_ms, node_views, request_of
from gpuloom.placement.resources import NodeView, Request, fits_locally, gpu_serves, host_fits
from gpuloom.queueing.order import (
    dependency_status,
    gpu_demand,
    queue_order,
    quota_book,
    upfront_demand,
)
from gpuloom.queueing.quota import QuotaBook
from gpuloom.state import ClusterState, JobState

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


def node_verdict(
    request: Request, node: NodeView, idle: NodeView, ready: bool, cordoned: str | None = None
) -> str:
    """The first rule that keeps one replica of `request` off `node`, or "fits".

    `cordoned`: the reason an admin cordoned the node, if they did.
    """
    if not ready:
        return "lost: the node does not heartbeat"
    if cordoned is not None:
        return f"cordoned: {cordoned or 'taken out of placement by an admin'}"
    if any(node.labels.get(k) != v for k, v in request.node_selector):
        return "labels: the node does not match the node selector"
    if request.gpus:
        if request.models and not any(g.model in request.models for g in idle.gpus):
            return f"model: no {' or '.join(request.models)} GPU"
        if not any(gpu_serves(request, g) for g in idle.gpus):
            pool = "vgpu" if request.fractional else request.pool
            return f"pool: no GPU of the {pool} pool can serve it"
        if sum(1 for g in idle.gpus if gpu_serves(request, g)) < request.gpus:
            where = " (local-only)" if request.locality == "local-only" else ""
            return f"capacity: fewer than {request.gpus} such GPUs on the node{where}"
    if not host_fits(request, idle):
        return "capacity: not enough CPU or memory on the node, even idle"
    if not host_fits(request, node):
        return "busy: its CPU or memory is in use"
    if request.gpus and sum(1 for g in node.gpus if gpu_serves(request, g)) < request.gpus:
        return "busy: its GPUs are in use"
    return "fits"


def _estimated_start(state: ClusterState, job: JobState, request: Request) -> datetime | None:
    """When the first node could host the job if running jobs end at their time limits."""
    best: datetime | None = None
    views = {v.name: v for v in node_views(state)}
    for name, view in sorted(views.items()):
        running = sorted(
            (
                state.jobs[j]
                for j in state.on_node.get(name, ())
                if state.jobs[j].phase == "running"
            ),
            key=lambda j: j.job_id,
        )
        ends: list[tuple[datetime, JobState]] = []
        for other in running:
            if other.spec.time_limit_s is None or other.started_at is None:
                ends = []
                break
            ends.append((other.started_at + timedelta(seconds=other.spec.time_limit_s), other))
        for end, other in sorted(ends, key=lambda pair: (pair[0], pair[1].job_id)):
            for gpu in view.gpus:
                holder = state.nodes[name].gpus[gpu.index].holders.get(other.job_id)
                if holder:
                    gpu.milli_free += holder[0]
                    gpu.memory_free_mib += holder[1]
            cpu, memory = state.nodes[name].hosted.get(other.job_id, (0, 0))
            if view.cpu_free_milli is not None:
                view.cpu_free_milli += cpu
            if view.memory_free_mib is not None:
                view.memory_free_mib += memory
            if host_fits(request, view) and (
                sum(1 for g in view.gpus if gpu_serves(request, g)) >= request.gpus
            ):
                best = end if best is None else min(best, end)
                break
    return best


def _model_quota_refusal(state: ClusterState, job: JobState, book: QuotaBook) -> str | None:
    """A refusal when every GPU model (and pool) the job could land on is over quota.

    Model and pool quotas are checked once a placement is known; a job that no
    allowed model's quota admits is held by them however much room there is.
    """
    demand = gpu_demand(job)
    if not demand or not any(r.startswith(("model:", "pool:")) for r in book.trackers):
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
        why = book.why_not(job.spec.account, {f"model:{model}": demand, f"pool:{pool}": demand})
        if why is None:
            return None
        reasons.append(why)
    return reasons[0] if reasons else None


def _brief(state: ClusterState, job: JobState) -> Explanation:
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
    if not any(fits_locally(request, view) for view in node_views(state)):
        return Explanation(job.job_id, job.phase, "Resources", "no node has room for it now")
    strict = (state.queue_policy or QueuePolicySet()).backfill == "off"
    if reserved is not None and not strict:
        detail = f"it would delay {reserved.job_id}, which holds the reservation"
        return Explanation(job.job_id, job.phase, "Reservation", detail)
    return Explanation(job.job_id, job.phase, "Priority", "job(s) ahead in the queue")


def explain(state: ClusterState, job_id: str, brief: bool = False) -> Explanation | None:
    """Why `job_id` is pending (see the module doc). `brief`: the reason code and detail
    only, cheap enough for `GET /v1/jobs/{id}`, which clients poll (`_brief`)."""
    job = state.jobs.get(job_id)
    if job is None:
        ended = state.tombstones.get(job_id)  # ended and forgotten (retention.py)
        return Explanation(job_id, ended.phase, None, None) if ended is not None else None
    if job.phase not in ("submitted", "admitted", "queued"):
        return Explanation(job_id, job.phase, None, job.reason)
    if job.cancel_requested:
        return Explanation(job_id, job.phase, "Held", "a cancel request is being carried out")
    if job.spec.depends_on:
        status, why = dependency_status(state, job)
        if status != "met":
            return Explanation(job_id, job.phase, "Dependency", why)
    if job.phase != "queued":
        return Explanation(job_id, job.phase, "Priority", "admission and queueing are pending")
    book = quota_book(state)
    held = book.why_not(job.spec.account, upfront_demand(job.spec), job.spec.user)
    if held is None:
        held = _model_quota_refusal(state, job, book)
    if held is not None:  # "QuotaExceeded: ..." or "AssocGrpGRES: ..." (max_gpus)
        return Explanation(job_id, job.phase, held.partition(":")[0], held)
    if brief:
        return _brief(state, job)
    order = [j.job_id for j in queue_order(state)]
    position = order.index(job_id) + 1 if job_id in order else None
    ahead = order[: (position or 1) - 1][:AHEAD_SHOWN]
    request = request_of(job.spec)
    current = {v.name: v for v in node_views(state, include_lost=True)}
    idle = {v.name: v for v in node_views(state, idle=True, include_lost=True)}
    verdicts = {
        name: node_verdict(
            request,
            current[name],
            idle[name],
            state.nodes[name].phase == "ready",
            state.nodes[name].cordon_reason if state.nodes[name].cordoned else None,
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
    elif any(v == "fits" for v in verdicts.values()):
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
    else:
        reason, detail = "Resources", "no node has room for it now"
    if reason == "Resources" and estimate is None:
        estimate = _estimated_start(state, job, request)
    return Explanation(job_id, job.phase, reason, detail, position, ahead, verdicts, estimate)

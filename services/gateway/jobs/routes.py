"""/v1/jobs: list, show, cancel, audit trail, logs (submission: `submit`, `batch`).

Anyone authenticated lists and shows jobs, but another user's command is hidden;
cancelling, reading logs and events is for the job's user, the coordinators of its
account and operators (`gpuloom.auth.policy.job_problem`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import orjson
from fastapi import APIRouter, HTTPException, Query

from gpuloom.auth import Principal
from gpuloom.auth.visibility import job_events_problem
from gpuloom.bus import EventBus
from gpuloom.bus.errors import BusError
from gpuloom.events import JobGrown, JobPlaced, JobStarted, MalformedEvent, decode
from gpuloom.events.logs import DEFAULT_TAIL, MAX_TAIL, LogsRequest
from gpuloom.events.subjects import agent_logs_subject, job_subjects
from services.gateway.auth import PrincipalDep, forbidden, job_refusal
from services.gateway.deps import EventLogDep, JobId, PublisherDep, ReadsDep, unavailable
from services.gateway.jobs.cancelling import cancel
from services.gateway.reads import Reads
from services.gateway.reads.arrays import array_view
from services.gateway.refusals import answer
from services.gateway.responses import UNAVAILABLE
from services.gateway.schemas import (
    CancelAccepted,
    Job,
    JobEvents,
    JobExplanation,
    JobList,
    JobLogs,
    LoggedEvent,
    Problem,
)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Problem}, 403: {"model": Problem}}
__all__ = ["UNAVAILABLE", "router"]


async def load_job(reads: Reads, job_id: str, principal: Principal) -> Job:
    """The job as its row says, once the caller's own writes are read; else 404."""
    await reads.catch_up(principal.name)
    job = await reads.jobs.row(job_id)
    if job is None:
        raise HTTPException(status_code=404, detail=f"job {job_id} not found")
    return job


@router.get("", response_model=JobList)
async def list_jobs(
    reads: ReadsDep,
    principal: PrincipalDep,
    state: str | None = None,
    user: str | None = None,
    account: str | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1, description="rows to skip")] = 0,
    order: Annotated[
        Literal["oldest", "newest"],
        Query(description="submission order: oldest first, or the latest first"),
    ] = "oldest",
) -> JobList:
    """Jobs that match the filters, a page at a time (`limit`, `offset`) in submission
    order, `order=newest` the latest first; `total` counts every match."""
    await reads.catch_up(principal.name)
    return await reads.jobs.page(
        principal, state, user, account, limit, offset, newest=order == "newest"
    )


@router.get("/{job_id}", response_model=Job, responses={**NOT_FOUND})
async def get_job(job_id: JobId, reads: ReadsDep, principal: PrincipalDep) -> Job:
    """The job; a pending one's `reason` is its explain code and detail (`QuotaExceeded: ...`).

    A job array's id answers with the array as a whole: its tasks' states counted
    in `array`, and one state for all (`running` while any task runs, ...).
    """
    await reads.catch_up(principal.name)
    found = await reads.jobs.lookup(job_id)
    if isinstance(found, Job):
        return reads.jobs.with_reason(reads.jobs.shown_to(found, principal))
    tasks = answer(found)  # 503 before the gateway read the log
    if not tasks:
        raise HTTPException(status_code=404, detail=f"job {job_id} not found")
    accounts = reads.accounts()
    return array_view(job_id, [reads.jobs.shown_to(task, principal, accounts) for task in tasks])


@router.delete(
    "/{job_id}",
    status_code=202,
    response_model=CancelAccepted,
    responses={**NOT_FOUND, 409: {"model": Problem}, **UNAVAILABLE},
)
async def cancel_job(
    job_id: JobId, publisher: PublisherDep, reads: ReadsDep, principal: PrincipalDep
) -> CancelAccepted:
    """Ask for cancellation; the queue (pending job) or the node agent (running job) does it.

    With a job array's id, every task that has not ended (one event, as `scancel <array id>`).
    """
    return answer(await cancel(publisher, reads, job_id, principal))


@router.get("/{job_id}/explain", response_model=JobExplanation, responses={**NOT_FOUND})
async def explain_job(job_id: JobId, reads: ReadsDep, principal: PrincipalDep) -> JobExplanation:
    """Why the job is pending: reason code, queue position, per-node verdicts, estimate.

    A job that ended long enough ago has left the live state (only a tombstone, or
    nothing, is kept there): its row says how it ended."""
    await reads.catch_up(principal.name)
    return answer(await reads.jobs.explanation(job_id))


@router.get("/{job_id}/events", response_model=JobEvents, responses={**NOT_FOUND, **UNAVAILABLE})
async def job_events(
    job_id: JobId, event_log: EventLogDep, reads: ReadsDep, principal: PrincipalDep
) -> JobEvents:
    """The job's audit trail, read from the log itself (not from a projection); each
    event a request caused names its `principal`.

    A task of a job array starts with its array's JobArraySubmitted (and any
    cancellation of the whole array).
    """
    bus = event_log.live()
    await reads.catch_up(principal.name)
    trail = answer(await reads.jobs.trail(job_id))
    problem = job_events_problem(principal, trail.owner, reads.accounts())  # as the stream's
    if problem is not None and trail.owner is None:  # voided by the fold, or not folded yet
        raise HTTPException(status_code=404, detail=f"job {job_id} not found")
    forbidden(problem)
    subjects = [job_subjects(aggregate) for aggregate in trail.aggregates]
    try:
        messages = [m for subject in subjects for m in await bus.read_subject(subject)]
    except (BusError, TimeoutError) as exc:
        raise unavailable(f"could not read the log: {exc}") from exc
    messages.sort(key=lambda message: message.seq)
    if not messages:
        raise HTTPException(status_code=404, detail=f"job {job_id} not found")
    events = []
    for message in messages:
        try:
            envelope = decode(message.seq, message.body, subject=message.subject).envelope
        except MalformedEvent:
            continue  # every service skipped it too; GET /v1/deadletters shows it
        events.append(LoggedEvent(seq=message.seq, **envelope.model_dump()))
    return JobEvents(job_id=job_id, events=events)


@router.get(
    "/{job_id}/logs",
    response_model=JobLogs,
    responses={**NOT_FOUND, **UNAVAILABLE, 502: {"model": Problem}},
)
async def job_logs(
    job_id: JobId,
    event_log: EventLogDep,
    reads: ReadsDep,
    principal: PrincipalDep,
    tail_bytes: Annotated[int, Query(ge=1, le=MAX_TAIL)] = DEFAULT_TAIL,
    replica: Annotated[int, Query(ge=0, le=1023, description="A gang's replica.")] = 0,
    attempt: Annotated[
        int | None, Query(ge=1, le=2**31 - 1, description="An earlier attempt; default: the last.")
    ] = None,
) -> JobLogs:
    """stdout and stderr of one replica's run (replica 0's, the job's last attempt, by
    default), fetched from the agent of the node it ran on."""
    job = await load_job(reads, job_id, principal)
    answer(job_refusal(reads.accounts(), principal, "logs", job.user, job.account))
    if job.node is None and attempt is None:
        why = f": {job.reason}" if job.reason else ""
        raise HTTPException(
            status_code=404,
            detail=f"job {job_id} has not run on a node: it is {job.state}{why}"
            f" (`gpuloom explain {job_id}` says more)",
        )
    bus = event_log.live()
    node = job.node
    if replica or attempt is not None:
        node = await _host_of(bus, job_id, attempt or job.attempt, replica)
    assert node is not None
    request = LogsRequest(
        job_id=job_id, tail_bytes=tail_bytes, replica=replica, attempt=attempt
    ).model_dump_json()
    try:
        reply = await bus.request(agent_logs_subject(node), request.encode(), timeout=3)
    except (BusError, TimeoutError) as exc:
        raise unavailable(f"the agent of node {node} did not answer: {exc}") from exc
    doc = orjson.loads(reply)
    if "error" in doc:
        raise HTTPException(status_code=502, detail=f"agent error: {doc['error']}")
    if not doc.get("found"):
        which = f"replica {replica} of job {job_id}" if replica else f"job {job_id}"
        if attempt is not None:
            which += f", attempt {attempt},"
        raise HTTPException(status_code=404, detail=f"node {node} holds no logs of {which}")
    return JobLogs(
        job_id=job_id,
        node=node,
        attempt=doc.get("attempt"),
        replica=replica,
        attempts=doc.get("attempts", []),
        stdout=doc.get("stdout", ""),
        stderr=doc.get("stderr", ""),
    )


async def _host_of(bus: EventBus, job_id: str, attempt: int, replica: int) -> str:
    """The node `replica` of `attempt` of the job ran on: where its JobStarted says it
    started (its logs are there), else where the attempt's JobPlaced (or an elastic
    gang's JobGrown, whose replicas are numbered after) put it."""
    try:
        messages = await bus.read_subject(job_subjects(job_id))
    except (BusError, TimeoutError) as exc:
        raise unavailable(f"could not read the log: {exc}") from exc
    hosts: list[str] | None = None
    started_on: str | None = None
    for message in messages:
        try:
            event = decode(message.seq, message.body, subject=message.subject).event
        except MalformedEvent:
            continue
        if isinstance(event, JobPlaced) and event.attempt == attempt and hosts is None:
            hosts = [r.host for r in event.assignments()]
        elif isinstance(event, JobGrown) and event.attempt == attempt and hosts is not None:
            grown = event.first == len(hosts)  # a voided one may have taken these numbers
            hosts.extend(r.host for r in event.replicas if grown)
        elif (
            isinstance(event, JobStarted)
            and (event.attempt, event.replica) == (attempt, replica)
            and started_on is None
        ):
            started_on = event.node  # only the node's own agent may write it
    if started_on is not None:
        return started_on
    if hosts is None:
        raise HTTPException(status_code=404, detail=f"job {job_id} has no attempt {attempt}")
    if replica >= len(hosts):
        raise HTTPException(
            status_code=404, detail=f"replica {replica}: job {job_id} has {len(hosts)} replica(s)"
        )
    return hosts[replica]

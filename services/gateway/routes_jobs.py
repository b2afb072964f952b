"""/v1/jobs: list, show, cancel, audit trail, logs (submission: routes_submit).

Anyone authenticated lists and shows jobs, but another user's command is hidden;
cancelling, reading logs and events is for the job's user, the coordinators of its
account and operators (`gpuloom.auth.policy.job_problem`)."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, HTTPException, Query
from sqlalchemy import func, select

from gpuloom.auth import Principal
from gpuloom.auth.policy import Accounts, JobAct, job_problem
from gpuloom.auth.visibility import job_events_problem
from gpuloom.bus import EventBus
from gpuloom.bus.errors import BusError
from gpuloom.decide.explain import Shared, explain, reason_text
from gpuloom.events import JobPlaced, MalformedEvent, decode
from gpuloom.events.logs import DEFAULT_TAIL, MAX_TAIL, LogsRequest
from gpuloom.events.subjects import agent_logs_subject, job_subjects
from gpuloom.state import PENDING_PHASES
from gpuloom.state.retention import owner
from gpuloom.store.models import JobRow
from services.gateway.arrays import array_rows, array_view
from services.gateway.auth import PrincipalDep, accounts_of, forbidden, job_refusal
from services.gateway.cancelling import cancel
from services.gateway.deps import Gateway, GatewayDep, JobId, SessionDep, unavailable
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


def to_job(row: JobRow, principal: Principal, accounts: Accounts) -> Job:
    """The job as `principal` may see it: its command hidden unless the policy allows."""
    job = Job.model_validate(row, from_attributes=True)
    if job_problem(principal, "details", row.user, row.account, accounts) is not None:
        job = job.model_copy(update={"command": None})
    return job


def check_job(gateway: Gateway, principal: Principal, act: JobAct, user: str, account: str) -> None:
    """403 unless `principal` may `act` on a job of `user` under `account`."""
    answer(job_refusal(gateway, principal, act, user, account))


async def load_job(
    gateway: GatewayDep, session: SessionDep, job_id: str, principal: Principal
) -> JobRow:
    await gateway.catch_up(principal.name)
    row = await session.get(JobRow, job_id)
    if row is None:
        raise HTTPException(status_code=404, detail=f"job {job_id} not found")
    return row


async def load_array(gateway: Gateway, session: SessionDep, array_id: str) -> list[JobRow]:
    """The rows of an array's tasks, by index; [] if `array_id` is no array (503
    before the gateway read the log: `arrays.array_rows`)."""
    return answer(await array_rows(gateway, session, array_id))


@router.get("", response_model=JobList)
async def list_jobs(
    gateway: GatewayDep,
    session: SessionDep,
    principal: PrincipalDep,
    state: str | None = None,
    user: str | None = None,
    account: str | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**63 - 1, description="rows to skip")] = 0,
) -> JobList:
    await gateway.catch_up(principal.name)
    query = select(JobRow)
    if state:
        query = query.where(JobRow.state == state)
    if user:
        query = query.where(JobRow.user == user)
    if account:
        query = query.where(JobRow.account == account)
    total = await session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = await session.scalars(
        query.order_by(JobRow.submit_seq, JobRow.id).limit(limit).offset(offset)
    )
    accounts = accounts_of(gateway)
    listed = [to_job(row, principal, accounts) for row in rows]
    pending = [job.id for job in listed if job.state in PENDING_PHASES]
    read_model = gateway.read_model
    shared = read_model.explainer(pending) if read_model is not None and pending else None
    jobs = [with_pending_reason(gateway, job, shared) for job in listed]
    return JobList(jobs=jobs, total=total)


def with_pending_reason(gateway: Gateway, job: Job, shared: Shared | None = None) -> Job:
    """A pending job with its explain code and detail as `reason` (squeue's REASON:
    `Resources: no node has room for it now`), what the row said kept after it.
    `shared`: what explaining the other jobs of a list computed already."""
    state = gateway.read_model.state if gateway.read_model is not None else None
    live = state.jobs.get(job.id) if state is not None else None
    # The rows are written a batch after the fold: explain only the state the row shows,
    # lest a row still `submitted` carry the reason of the job already queued.
    if state is None or live is None or live.phase != job.state or job.state not in PENDING_PHASES:
        return job
    if shared is None and gateway.read_model is not None:
        shared = gateway.read_model.explainer([job.id])
    found = explain(state, job.id, brief=True, shared=shared)
    if found is None or found.reason is None:
        return job
    reason = reason_text(found.reason, found.detail) or ""
    if job.reason and job.reason not in reason:  # e.g. "requeued: node-b lost"
        reason += f" ({job.reason})"
    return job.model_copy(update={"reason": reason})


@router.get("/{job_id}", response_model=Job, responses={**NOT_FOUND})
async def get_job(
    job_id: JobId, gateway: GatewayDep, session: SessionDep, principal: PrincipalDep
) -> Job:
    """The job; a pending one's `reason` is its explain code and detail (`QuotaExceeded: ...`).

    A job array's id answers with the array as a whole: its tasks' states counted
    in `array`, and one state for all (`running` while any task runs, ...).
    """
    await gateway.catch_up(principal.name)
    accounts = accounts_of(gateway)
    row = await session.get(JobRow, job_id)
    if row is None:
        tasks = await load_array(gateway, session, job_id)
        if not tasks:
            raise HTTPException(status_code=404, detail=f"job {job_id} not found")
        return array_view(job_id, [to_job(task, principal, accounts) for task in tasks])
    return with_pending_reason(gateway, to_job(row, principal, accounts))


@router.delete(
    "/{job_id}",
    status_code=202,
    response_model=CancelAccepted,
    responses={**NOT_FOUND, 409: {"model": Problem}, **UNAVAILABLE},
)
async def cancel_job(
    job_id: JobId, gateway: GatewayDep, session: SessionDep, principal: PrincipalDep
) -> CancelAccepted:
    """Ask for cancellation; the queue (pending job) or the node agent (running job) does it.

    With a job array's id, every task that has not ended (one event, as `scancel <array id>`).
    """
    return answer(await cancel(gateway, session, job_id, principal))


@router.get("/{job_id}/explain", response_model=JobExplanation, responses={**NOT_FOUND})
async def explain_job(
    job_id: JobId, gateway: GatewayDep, session: SessionDep, principal: PrincipalDep
) -> JobExplanation:
    """Why the job is pending: reason code, queue position, per-node verdicts, estimate.

    A job that ended long enough ago has left the live state (only a tombstone, or
    nothing, is kept there): its row says how it ended."""
    await gateway.catch_up(principal.name)
    if gateway.read_model is None:
        raise unavailable("the gateway has not read the log yet")
    found = explain(gateway.read_model.state, job_id, shared=gateway.read_model.explainer([job_id]))
    if found is None or job_id not in gateway.read_model.state.jobs:
        row = await session.get(JobRow, job_id)
        if row is not None:
            return JobExplanation(id=job_id, state=row.state, reason=None, detail=row.reason)
    if found is None:
        raise HTTPException(status_code=404, detail=f"job {job_id} not found")
    return JobExplanation(
        id=found.job_id,
        state=found.state,
        reason=found.reason,
        detail=found.detail,
        position=found.position,
        ahead=found.ahead,
        nodes=found.nodes,
        estimated_start=found.estimated_start,
    )


@router.get("/{job_id}/events", response_model=JobEvents, responses={**NOT_FOUND, **UNAVAILABLE})
async def job_events(
    job_id: JobId, gateway: GatewayDep, session: SessionDep, principal: PrincipalDep
) -> JobEvents:
    """The job's audit trail, read from the log itself (not from a projection); each
    event a request caused names its `principal`.

    A task of a job array starts with its array's JobArraySubmitted (and any
    cancellation of the whole array).
    """
    bus = gateway.live_bus()
    await gateway.catch_up(principal.name)
    if gateway.read_model is None:
        raise unavailable("the gateway has not read the log yet")
    state = gateway.read_model.state
    subjects = [job_subjects(job_id)]
    job = state.jobs.get(job_id)
    ended = state.tombstones.get(job_id)  # ended and forgotten by the fold (retention.py)
    if job is None and job_id in state.arrays:
        tasks = state.array_tasks(job_id)
        owned = next((found for task in tasks if (found := owner(state, task)) is not None), None)
    else:
        owned = owner(state, job_id)
        array_id = job.array_id if job is not None else ended.array_id if ended else None
        if array_id is not None:
            subjects.insert(0, job_subjects(array_id))
    if owned is None:  # ended longer ago than the fold remembers: the read model knows
        row = await session.get(JobRow, job_id)
        owned = (row.user, row.account) if row is not None else None
    problem = job_events_problem(principal, owned, accounts_of(gateway))  # as the stream's
    if problem is not None and owned is None:  # the fold voided it, or it is not folded yet
        raise HTTPException(status_code=404, detail=f"job {job_id} not found")
    forbidden(problem)
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
    gateway: GatewayDep,
    session: SessionDep,
    principal: PrincipalDep,
    tail_bytes: Annotated[int, Query(ge=1, le=MAX_TAIL)] = DEFAULT_TAIL,
    replica: Annotated[int, Query(ge=0, le=1023, description="A gang's replica.")] = 0,
    attempt: Annotated[
        int | None, Query(ge=1, le=2**31 - 1, description="An earlier attempt; default: the last.")
    ] = None,
) -> JobLogs:
    """stdout and stderr of one replica's run (replica 0's, the job's last attempt, by
    default), fetched from the agent of the node it ran on."""
    row = await load_job(gateway, session, job_id, principal)
    check_job(gateway, principal, "logs", row.user, row.account)
    if row.node is None and attempt is None:
        raise HTTPException(status_code=404, detail=f"job {job_id} has not run on a node")
    bus = gateway.live_bus()
    node = row.node
    if replica or attempt is not None:
        node = await _host_of(bus, job_id, attempt or row.attempt, replica)
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
    """The node `replica` of `attempt` of the job ran on, from the attempt's JobPlaced."""
    try:
        messages = await bus.read_subject(job_subjects(job_id))
    except (BusError, TimeoutError) as exc:
        raise unavailable(f"could not read the log: {exc}") from exc
    for message in messages:
        try:
            event = decode(message.seq, message.body, subject=message.subject).event
        except MalformedEvent:
            continue
        if isinstance(event, JobPlaced) and event.attempt == attempt:
            replicas = event.assignments()
            if replica >= len(replicas):
                raise HTTPException(
                    status_code=404,
                    detail=f"replica {replica}: job {job_id} has {len(replicas)} replica(s)",
                )
            return replicas[replica].host
    raise HTTPException(status_code=404, detail=f"job {job_id} has no attempt {attempt}")

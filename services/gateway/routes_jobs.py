"""/v1/jobs: submit, list, show, cancel, audit trail, logs."""

from __future__ import annotations

from typing import Annotated, Any

import orjson
from fastapi import APIRouter, Header, HTTPException, Query
from nats.errors import Error as NatsError
from sqlalchemy import func, select

from gpuloom.decide.explain import explain
from gpuloom.events import JobCancelRequested, JobSpec, JobSubmitted, decode
from gpuloom.events.codec import new_event_id
from gpuloom.events.subjects import agent_logs_subject, job_subjects
from gpuloom.state import FINAL_PHASES, PENDING_PHASES
from gpuloom.store.models import JobRow
from services.gateway.deps import Gateway, GatewayDep, SessionDep, unavailable
from services.gateway.publish import publish
from services.gateway.schemas import (
    CancelAccepted,
    Job,
    JobEvents,
    JobExplanation,
    JobList,
    JobLogs,
    LoggedEvent,
    Problem,
    Submitted,
)

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
NOT_FOUND: dict[int | str, dict[str, Any]] = {404: {"model": Problem}}
UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": Problem, "description": "NATS unreachable; retry after Retry-After"}
}


def to_job(row: JobRow) -> Job:
    return Job.model_validate(row, from_attributes=True)


async def load_job(gateway: GatewayDep, session: SessionDep, job_id: str) -> JobRow:
    await gateway.catch_up()
    row = await session.get(JobRow, job_id)
    if row is None:
        raise HTTPException(status_code=404, detail=f"job {job_id} not found")
    return row


@router.post("", status_code=202, response_model=Submitted, responses={**UNAVAILABLE})
async def submit_job(
    spec: JobSpec,
    gateway: GatewayDep,
    idempotency_key: Annotated[str | None, Header(max_length=200)] = None,
) -> Submitted:
    """Accept a job once its JobSubmitted event is acknowledged by the log.

    A retry with the same `Idempotency-Key` returns the job the first request
    created, never a second one.
    """
    if spec.array is not None:
        return await _submit_array(gateway, spec, idempotency_key)
    if idempotency_key is not None:
        async with gateway.sessions() as session:
            existing = await session.scalar(
                select(JobRow).where(JobRow.idempotency_key == idempotency_key)
            )
        if existing is not None:
            return Submitted(id=existing.id, state=existing.state)
    event = JobSubmitted(job_id=new_event_id(), spec=spec, idempotency_key=idempotency_key)
    msg_id = f"submit:{idempotency_key}" if idempotency_key else None
    recorded = await publish(gateway, event, msg_id)
    assert isinstance(recorded.event, JobSubmitted)
    return Submitted(id=recorded.event.job_id, state="submitted")


async def _submit_array(gateway: Gateway, spec: JobSpec, key: str | None) -> Submitted:
    """One JobSubmitted per task, `<array id>-<index>`; a retried key returns the same tasks."""
    size = spec.array or 1
    keys = [f"{key}:{i}" for i in range(size)] if key else [None] * size
    if key is not None:
        async with gateway.sessions() as session:
            first = await session.scalar(select(JobRow).where(JobRow.idempotency_key == keys[0]))
        if first is not None:
            array_id = first.id.rsplit("-", 1)[0]
            return Submitted(
                id=array_id, state="submitted", tasks=[f"{array_id}-{i}" for i in range(size)]
            )
    array_id = new_event_id()
    task_spec = spec.model_copy(update={"array": None})
    tasks = []
    for index in range(size):
        event = JobSubmitted(
            job_id=f"{array_id}-{index}",
            spec=task_spec,
            idempotency_key=keys[index],
            array_id=array_id,
            array_index=index,
        )
        recorded = await publish(gateway, event, f"submit:{keys[index]}" if key else None)
        assert isinstance(recorded.event, JobSubmitted)
        tasks.append(recorded.event.job_id)
    return Submitted(id=array_id, state="submitted", tasks=tasks)


@router.get("", response_model=JobList)
async def list_jobs(
    gateway: GatewayDep,
    session: SessionDep,
    state: str | None = None,
    user: str | None = None,
    account: str | None = None,
    limit: Annotated[int, Query(ge=1, le=5000)] = 100,
    offset: Annotated[int, Query(ge=0)] = 0,
) -> JobList:
    await gateway.catch_up()
    query = select(JobRow)
    if state:
        query = query.where(JobRow.state == state)
    if user:
        query = query.where(JobRow.user == user)
    if account:
        query = query.where(JobRow.account == account)
    total = await session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = await session.scalars(query.order_by(JobRow.submit_seq).limit(limit).offset(offset))
    return JobList(jobs=[to_job(row) for row in rows], total=total)


@router.get("/{job_id}", response_model=Job, responses={**NOT_FOUND})
async def get_job(job_id: str, gateway: GatewayDep, session: SessionDep) -> Job:
    """The job; a pending one's `reason` is its explain code and detail (`QuotaExceeded: ...`)."""
    job = to_job(await load_job(gateway, session, job_id))
    if job.state in PENDING_PHASES and gateway.projector is not None:
        found = explain(gateway.projector.state, job_id, brief=True)
        if found is not None and found.reason is not None:
            detail = found.detail or ""
            reason = detail if detail.startswith(found.reason) else f"{found.reason}: {detail}"
            if job.reason and job.reason not in reason:  # e.g. "requeued: node-b lost"
                reason += f" ({job.reason})"
            job = job.model_copy(update={"reason": reason})
    return job


@router.delete(
    "/{job_id}",
    status_code=202,
    response_model=CancelAccepted,
    responses={**NOT_FOUND, 409: {"model": Problem}, **UNAVAILABLE},
)
async def cancel_job(job_id: str, gateway: GatewayDep, session: SessionDep) -> CancelAccepted:
    """Ask for cancellation; the queue (pending job) or the node agent (running job) does it."""
    row = await load_job(gateway, session, job_id)
    if row.state in FINAL_PHASES:
        raise HTTPException(status_code=409, detail=f"job {job_id} already {row.state}")
    await publish(gateway, JobCancelRequested(job_id=job_id), f"{job_id}:cancel-request")
    return CancelAccepted(id=job_id, state=row.state, cancel_requested=True)


@router.get("/{job_id}/explain", response_model=JobExplanation, responses={**NOT_FOUND})
async def explain_job(job_id: str, gateway: GatewayDep) -> JobExplanation:
    """Why the job is pending: reason code, queue position, per-node verdicts, estimate."""
    await gateway.catch_up()
    if gateway.projector is None:
        raise unavailable("the gateway has not read the log yet")
    found = explain(gateway.projector.state, job_id)
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
async def job_events(job_id: str, gateway: GatewayDep) -> JobEvents:
    """The job's audit trail, read from the log itself (not from a projection)."""
    bus = gateway.live_bus()
    try:
        messages = await bus.read_subject(job_subjects(job_id))
    except (NatsError, TimeoutError) as exc:
        raise unavailable(f"could not read the log: {exc}") from exc
    if not messages:
        raise HTTPException(status_code=404, detail=f"job {job_id} not found")
    events = []
    for message in messages:
        envelope = decode(message.seq, message.body).envelope
        events.append(LoggedEvent(seq=message.seq, **envelope.model_dump()))
    return JobEvents(job_id=job_id, events=events)


@router.get("/{job_id}/logs", response_model=JobLogs, responses={**NOT_FOUND, **UNAVAILABLE})
async def job_logs(
    job_id: str,
    gateway: GatewayDep,
    session: SessionDep,
    tail_bytes: Annotated[int, Query(ge=1, le=16 * 1024 * 1024)] = 65536,
) -> JobLogs:
    """stdout and stderr of the job's latest run, fetched from the agent of its node."""
    row = await load_job(gateway, session, job_id)
    if row.node is None:
        raise HTTPException(status_code=404, detail=f"job {job_id} has not run on a node")
    bus = gateway.live_bus()
    request = orjson.dumps({"job_id": job_id, "tail_bytes": tail_bytes})
    try:
        reply = await bus.nc.request(agent_logs_subject(row.node), request, timeout=3)
    except (NatsError, TimeoutError) as exc:
        raise unavailable(f"the agent of node {row.node} did not answer: {exc}") from exc
    doc = orjson.loads(reply.data)
    if "error" in doc:
        raise HTTPException(status_code=502, detail=f"agent error: {doc['error']}")
    if not doc.get("found"):
        raise HTTPException(
            status_code=404, detail=f"node {row.node} holds no logs of job {job_id}"
        )
    return JobLogs(
        job_id=job_id,
        node=row.node,
        attempt=doc.get("attempt"),
        stdout=doc.get("stdout", ""),
        stderr=doc.get("stderr", ""),
    )

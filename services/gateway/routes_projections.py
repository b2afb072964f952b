"""/v1/projections (each SQL projection's checkpoint, lag and quarantined rows) and
/readyz (whether this gateway's read model keeps up with the log).

/healthz stays liveness: the process answers. /readyz answers without a token (on
`public`); /v1/projections shows rows of jobs, for operators only. /readyz is readiness: a load
balancer should send requests elsewhere while this gateway replays the log after
a start, or while its projection falls behind (the database is away, or slow),
because its reads would miss accepted jobs.
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from sqlalchemy import select

from gpuloom.bus.errors import BusError
from gpuloom.store.models import ProjectionCheckpoint, ProjectionQuarantine
from gpuloom.store.quarantine import count_quarantined
from services.gateway.auth import operator
from services.gateway.deps import GatewayDep, SessionDep

router = APIRouter()
#: Routes that answer without a token (a load balancer's probe has none).
public = APIRouter()


class Ready(BaseModel):
    ready: bool
    status: Literal["ready", "starting", "lagging", "unavailable"]
    #: Events in the log the projection has not folded and written yet (None: unknown).
    lag: int | None
    stream_seq: int | None
    written_seq: int
    max_lag: int
    quarantined: int
    detail: str


class QuarantinedRow(BaseModel):
    kind: str
    key: str
    seq: int
    error: str
    row: Any
    at: datetime


class Projection(BaseModel):
    name: str
    #: Last stream sequence the projection committed (its checkpoint row).
    checkpoint: int
    #: This gateway's live projection only: sequence it has folded and written.
    written_seq: int | None = None
    #: Events it has not written yet (None: unknown, the log is unreachable).
    lag: int | None
    quarantined: int
    rows: list[QuarantinedRow]


class Projections(BaseModel):
    stream_seq: int | None
    projections: list[Projection]


@public.get("/readyz", response_model=Ready, tags=["health"], responses={503: {"model": Ready}})
async def readyz(gateway: GatewayDep) -> JSONResponse:
    """200 when the projection keeps up with the log, else 503; the lag in both."""
    readiness = gateway.readiness
    read_model = gateway.read_model
    written = read_model.written_seq if read_model is not None else 0
    quarantined = read_model.quarantined if read_model is not None else 0
    lag: int | None = None
    if read_model is not None and gateway.bus is not None and gateway.bus.connected:
        try:
            lag = await read_model.lag_behind_stream()
        except (BusError, TimeoutError, OSError):
            lag = None
    if read_model is None or lag is None:
        status: Literal["ready", "starting", "lagging", "unavailable"] = "unavailable"
        detail = "the event log (NATS) is unreachable: the lag is unknown"
    else:
        status = readiness.observe(lag, time.monotonic())
        detail = {
            "ready": f"{lag} events behind the log",
            "starting": f"replaying the log since start: {lag} events to go",
            "lagging": f"{lag} events behind the log for over {readiness.grace_s:g} s",
        }[status]
    view = Ready(
        ready=status == "ready",
        status=status,
        lag=lag,
        stream_seq=read_model.stream_seq if read_model is not None and lag is not None else None,
        written_seq=written,
        max_lag=readiness.max_lag,
        quarantined=quarantined,
        detail=detail,
    )
    return JSONResponse(status_code=200 if view.ready else 503, content=view.model_dump())


@router.get(
    "/v1/projections",
    response_model=Projections,
    tags=["health"],
    dependencies=[Depends(operator("read the projections' state"))],
)
async def projections(
    gateway: GatewayDep,
    session: SessionDep,
    limit: Annotated[
        int, Query(ge=0, le=10_000, description="quarantined rows per projection")
    ] = 100,
) -> Projections:
    """Each SQL projection: its checkpoint, its lag behind the log, the rows quarantined."""
    checkpoints = {
        row.name: row.last_seq for row in await session.scalars(select(ProjectionCheckpoint))
    }
    counts = await count_quarantined(session)
    read_model = gateway.read_model
    names = (
        set(checkpoints) | set(counts) | ({read_model.name} if read_model is not None else set())
    )
    bus = gateway.bus if gateway.bus is not None and gateway.bus.connected else None
    stream_seq: int | None = None
    if bus is not None:
        try:
            stream_seq = await bus.last_seq()
        except (BusError, TimeoutError, OSError):
            stream_seq = None
    views = []
    for name in sorted(names):
        checkpoint = checkpoints.get(name, 0)
        live = read_model if read_model is not None and read_model.name == name else None
        lag: int | None = None
        if live is not None and stream_seq is not None:
            live.stream_seq = max(live.stream_seq, stream_seq)
            lag = live.lag
        elif stream_seq is not None:  # another process's: its checkpoint follows its fold
            lag = max(0, stream_seq - checkpoint)
        entries = await session.scalars(
            select(ProjectionQuarantine)
            .where(ProjectionQuarantine.projection == name)
            .order_by(ProjectionQuarantine.kind, ProjectionQuarantine.key)
            .limit(limit)
        )
        views.append(
            Projection(
                name=name,
                checkpoint=checkpoint,
                written_seq=live.written_seq if live is not None else None,
                lag=lag,
                quarantined=counts.get(name, 0),
                rows=[_quarantined(entry) for entry in entries],
            )
        )
    return Projections(stream_seq=stream_seq, projections=views)


def _quarantined(entry: ProjectionQuarantine) -> QuarantinedRow:
    try:
        row: Any = json.loads(entry.row)
    except ValueError:
        row = entry.row
    return QuarantinedRow(
        kind=entry.kind, key=entry.key, seq=entry.seq, error=entry.error, row=row, at=entry.at
    )

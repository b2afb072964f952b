"""/v1/projections (each SQL projection's checkpoint, lag and quarantined rows) and
/readyz (whether this gateway's read model keeps up with the log).

/healthz stays liveness: the process answers. /readyz answers without a token (on
`public`); /v1/projections shows rows of jobs, for operators only. /readyz is readiness: a load
balancer should send requests elsewhere while this gateway replays the log after
a start, or while its projection falls behind (the database is away, or slow),
because its reads would miss accepted jobs.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from services.gateway.auth import operator
from services.gateway.deps import ReadsDep
from services.gateway.schemas import Projections, Ready

router = APIRouter()
#: Routes that answer without a token (a load balancer's probe has none).
public = APIRouter()


@public.get("/readyz", response_model=Ready, tags=["health"], responses={503: {"model": Ready}})
async def readyz(reads: ReadsDep) -> JSONResponse:
    """200 when the projection keeps up with the log, else 503; the lag in both."""
    view = await reads.progress.ready(time.monotonic)
    return JSONResponse(status_code=200 if view.ready else 503, content=view.model_dump())


@router.get(
    "/v1/projections",
    response_model=Projections,
    tags=["health"],
    dependencies=[Depends(operator("read the projections' state"))],
)
async def projections(
    reads: ReadsDep,
    limit: Annotated[
        int, Query(ge=0, le=10_000, description="quarantined rows per projection")
    ] = 100,
) -> Projections:
    """Each SQL projection: its checkpoint, its lag behind the log, the rows quarantined."""
    return await reads.progress.projections(limit)

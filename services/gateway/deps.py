"""What the routes depend on, built from the app's state (`app.state.gateway`, the
`parts.Gateway`): the gateway itself, and the read facade (`services.gateway.reads`)
through which every read of the fold and the SQL rows goes."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request

from gpuloom.events.base import SUBJECT_TOKEN
from services.gateway import refusals
from services.gateway.parts import Gateway
from services.gateway.reads import Reads


def unavailable(detail: str) -> HTTPException:
    """503 with Retry-After, to raise (a read's answer; a command returns the refusal)."""
    return refusals.unavailable(detail).error()


async def get_gateway(request: Request) -> Gateway:
    """Async on purpose: FastAPI runs a plain `def` dependency in a worker thread."""
    gateway: Gateway = request.app.state.gateway
    return gateway


async def get_reads(request: Request) -> Reads:
    """The read facade of the app's gateway (a few small objects, made per request)."""
    return Reads(request.app.state.gateway)


GatewayDep = Annotated[Gateway, Depends(get_gateway)]
ReadsDep = Annotated[Reads, Depends(get_reads)]

#: The dependencies that reach the gateway's state: a route that takes one of them may
#: answer 503 (NATS, or the gateway's read of the log, is not there yet), which its
#: OpenAPI operation documents (`problems.add_problems`).
STATEFUL: frozenset[Any] = frozenset({get_gateway, get_reads})

#: Ids in paths become NATS subject tokens (`gpuloom.evt.job.<id>.*`) or keys of the
#: log: a `*`, `>` or `.` would widen a subject to other jobs' events, so each is
#: checked as a subject token (422 naming the parameter) before any route reads it.
JobId = Annotated[
    str, Path(pattern=SUBJECT_TOKEN.pattern, description="a job id, or a job array's id")
]
NodeName = Annotated[str, Path(pattern=SUBJECT_TOKEN.pattern, description="a node name")]
AccountName = Annotated[str, Path(pattern=SUBJECT_TOKEN.pattern, description="an account")]

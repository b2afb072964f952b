"""What the routes depend on, each built from the app's state (`app.state.gateway`, the
`parts.Gateway`), so that a route takes only what it uses: the read facade
(`ReadsDep`: every read of the fold and the SQL rows), the publisher (`PublisherDep`:
every write to the log), the event log for reading it (`EventLogDep`), the settings,
and what the event streams share. The caller is `auth.PrincipalDep`."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, HTTPException, Path, Request

from gpuloom.auth import TokenVerifier
from gpuloom.config import Settings
from gpuloom.events.base import SUBJECT_TOKEN
from services.gateway import refusals
from services.gateway.eventlog import EventLog
from services.gateway.parts import Gateway
from services.gateway.publish import Publisher
from services.gateway.reads import Reads
from services.gateway.stream import Streams
from services.gateway.stream_budget import StreamBudget


def unavailable(detail: str) -> HTTPException:
    """503 with Retry-After, to raise (a read's answer; a command returns the refusal)."""
    return refusals.unavailable(detail).error()


# Each is async on purpose: FastAPI runs a plain `def` dependency in a worker thread.


def _gateway(request: Request) -> Gateway:
    gateway: Gateway = request.app.state.gateway
    return gateway


async def get_reads(request: Request) -> Reads:
    """The read facade of the app's gateway (a few small objects, made per request)."""
    return Reads(_gateway(request))


async def get_publisher(request: Request) -> Publisher:
    return Publisher(_gateway(request))


async def get_event_log(request: Request) -> EventLog:
    return EventLog(_gateway(request))


async def get_settings(request: Request) -> Settings:
    return _gateway(request).settings


async def get_verifier(request: Request) -> TokenVerifier | None:
    """The bearer tokens' verifier; None: authentication is off."""
    return _gateway(request).verifier


async def get_streams(request: Request) -> Streams:
    return _gateway(request).streams


async def get_stream_budget(request: Request) -> StreamBudget:
    return _gateway(request).stream_budget


ReadsDep = Annotated[Reads, Depends(get_reads)]
PublisherDep = Annotated[Publisher, Depends(get_publisher)]
EventLogDep = Annotated[EventLog, Depends(get_event_log)]
SettingsDep = Annotated[Settings, Depends(get_settings)]
VerifierDep = Annotated[TokenVerifier | None, Depends(get_verifier)]
StreamsDep = Annotated[Streams, Depends(get_streams)]
StreamBudgetDep = Annotated[StreamBudget, Depends(get_stream_budget)]

#: The dependencies that reach the gateway's live state (the log, the fold, the rows):
#: a route that takes one of them may answer 503 (NATS, or the gateway's read of the
#: log, is not there yet), which its OpenAPI operation documents (`problems.add_problems`).
STATEFUL: frozenset[Any] = frozenset({get_reads, get_publisher, get_event_log})

#: Ids in paths become NATS subject tokens (`gpuloom.evt.job.<id>.*`) or keys of the
#: log: a `*`, `>` or `.` would widen a subject to other jobs' events, so each is
#: checked as a subject token (422 naming the parameter) before any route reads it.
JobId = Annotated[
    str, Path(pattern=SUBJECT_TOKEN.pattern, description="a job id, or a job array's id")
]
NodeName = Annotated[str, Path(pattern=SUBJECT_TOKEN.pattern, description="a node name")]
AccountName = Annotated[str, Path(pattern=SUBJECT_TOKEN.pattern, description="an account")]

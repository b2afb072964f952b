"""GET /v1/events: the log as a stream of CloudEvents (Server-Sent Events).

The contract for tools (docs/events.md): each SSE event's `data` is one CloudEvents 1.0
JSON object (`gpuloom.events.cloud`) and its `id` the event's sequence in the log. A
client that reconnects with `Last-Event-ID` (browsers do it by themselves) or asks
`?after=SEQ` gets every event after that sequence, in order, exactly once; without
either it starts at the log's end (new events only); `?after=0` replays the log from
its start. Filters narrow it; what a principal may see is `services.gateway.stream`'s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Query
from fastapi.responses import StreamingResponse
from starlette.background import BackgroundTask

from gpuloom.auth.policy import Accounts
from gpuloom.auth.visibility import Owners, StreamFilter
from gpuloom.bus import EventBus
from gpuloom.bus.errors import BusError
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.cloud import event_type_named
from gpuloom.events.registry import EVENT_TYPES
from services.gateway.auth import PrincipalDep
from services.gateway.deps import (
    EventLogDep,
    ReadsDep,
    StreamBudgetDep,
    StreamsDep,
    unavailable,
)
from services.gateway.refusals import answer
from services.gateway.stream import Streams, event_stream
from services.gateway.stream_budget import Ticket

router = APIRouter(tags=["events"])

Token = Annotated[str | None, Query(pattern=SUBJECT_TOKEN.pattern)]


def resume_point(last_event_id: str | None, after: int | None) -> int | None:
    """The sequence to resume after: `Last-Event-ID` (a reconnect), else `after`."""
    if last_event_id is None:
        return after
    if not last_event_id.isdigit() or len(last_event_id) > 19:
        raise HTTPException(
            status_code=422,
            detail=f"header.last-event-id: {last_event_id!r} is not an event's sequence "
            "(the `id` of an event of this stream)",
        )
    return int(last_event_id)


@dataclass(frozen=True, slots=True)
class StreamRequest:
    """A stream request checked before its answer starts (a 4xx or 503 is still
    possible then; once the stream runs, only an `error` event is)."""

    bus: EventBus
    start: int
    wanted: StreamFilter
    owners: Owners
    accounts: Callable[[], Accounts]
    shared: Streams
    ticket: Ticket


async def stream_request(
    event_log: EventLogDep,
    reads: ReadsDep,
    budget: StreamBudgetDep,
    shared: StreamsDep,
    principal: PrincipalDep,
    types: Annotated[
        list[str] | None,
        Query(
            alias="type",
            description="event types to keep (repeat it), e.g. JobFinished, or the CloudEvents"
            " type the events carry, io.gpuloom.job.JobFinished.v1",
        ),
    ] = None,
    job: Token = None,
    user: Token = None,
    account: Token = None,
    node: Token = None,
    after: Annotated[
        int | None, Query(ge=0, le=2**63 - 1, description="resume after this sequence")
    ] = None,
    last_event_id: Annotated[str | None, Header(alias="Last-Event-ID")] = None,
) -> StreamRequest:
    types = [event_type_named(name) for name in types or ()]
    unknown = sorted(set(types) - set(EVENT_TYPES))
    if unknown:
        raise HTTPException(
            status_code=422,
            detail=f"query.type: unknown event type(s) {', '.join(unknown)} "
            f"(known: {', '.join(sorted(EVENT_TYPES))})",
        )
    bus = event_log.live()
    owners = answer(reads.events.owners())  # 503 before the gateway read the log
    start = resume_point(last_event_id, after)
    budget.check_room(principal.name)  # before it costs a read of the log
    try:
        log_end = await bus.last_seq()
    except (BusError, TimeoutError) as exc:
        raise unavailable(f"could not read the log: {exc}") from exc
    if start is None:
        start = log_end
    replay = budget.is_replay(start, log_end, one_job=job is not None)
    ticket = budget.take(principal.name, replay, time.monotonic())
    wanted = StreamFilter(frozenset(types or ()), job, user, account, node)
    return StreamRequest(bus, start, wanted, owners, reads.accounts, shared, ticket)


@router.get(
    "/v1/events",
    response_class=StreamingResponse,
    responses={
        200: {
            "description": "Server-Sent Events: `open`, then one event per log event "
            "(`id`: its sequence; `data`: its CloudEvent), `error` when the stream ends",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
        },
        422: {},
        429: {},
        503: {},
    },
)
async def events(
    principal: PrincipalDep,
    request: Annotated[StreamRequest, Depends(stream_request)],
) -> StreamingResponse:
    """Events of the log as CloudEvents, then new ones as they are written (see the
    module doc); an `error` event says why a stream ends (`gone`, `slow`). Each user
    holds a bounded number of streams and replays (429 with Retry-After past it:
    `services.gateway.stream_budget`).

    The stream writes its own SSE (`services.gateway.stream`): every event waiting for
    a client goes in one write, where FastAPI's SSE would make one per event."""
    chunks = event_stream(
        request.bus,
        request.start,
        request.wanted,
        principal,
        request.owners,
        request.accounts,
        request.shared,
        request.ticket,
    )
    return StreamingResponse(
        chunks,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
        background=BackgroundTask(request.ticket.close),  # if the stream never started
    )

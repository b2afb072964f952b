"""/v1/deadletters: what the services could not handle, newest first (the DLQ stream).
Operators only: an excerpt may hold any job's command and environment."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, ConfigDict

from gpuloom.bus.streams import dead_letter_stream
from services.gateway.auth import operator
from services.gateway.deps import EventLogDep
from services.gateway.responses import UNAVAILABLE

router = APIRouter(tags=["operations"])


class DeadLetterView(BaseModel):
    """One dead letter. Optional fields: the stream is bounded, not validated on write."""

    model_config = ConfigDict(extra="ignore")

    dlq_seq: int
    service: str | None = None
    #: `log` (a stream entry at `seq`) or `heartbeat` (core NATS, no seq).
    source: str | None = None
    seq: int | None = None
    subject: str | None = None
    #: `malformed`, `fault` (a fold rule failed on it) or `heartbeat`.
    reason_kind: str | None = None
    reason: str | None = None
    envelope_id: str | None = None
    #: Size of the whole message; `excerpt` holds its first bytes (may include job data).
    size: int | None = None
    excerpt: str | None = None
    excerpt_encoding: str | None = None
    at: str | None = None


class DeadLetterList(BaseModel):
    stream: str
    #: Dead letters the stream holds (it keeps 30 days, 100,000 at most).
    total: int
    dead_letters: list[DeadLetterView]


@router.get(
    "/v1/deadletters",
    response_model=DeadLetterList,
    responses={**UNAVAILABLE},
    dependencies=[Depends(operator("read dead letters (they hold excerpts of any job)"))],
)
async def dead_letters(
    event_log: EventLogDep, limit: Annotated[int, Query(ge=1, le=1000)] = 50
) -> DeadLetterList:
    """Messages a service could not handle and skipped, newest first, with the reason."""
    bus = event_log.live()
    total, letters = await bus.dead_letter_page(limit)
    return DeadLetterList(
        stream=dead_letter_stream(bus.stream),
        total=total,
        dead_letters=[DeadLetterView.model_validate(letter) for letter in letters],
    )

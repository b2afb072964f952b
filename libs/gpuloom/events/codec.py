"""Encode events into envelopes on the wire, and decode them back (with upcasting).

A `Recorded` is an event as read back from the log: its stream sequence, its
envelope and its typed payload. This is what the fold consumes.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
from pydantic import ValidationError
from ulid import ULID

from gpuloom.events.base import Envelope, Event
from gpuloom.events.registry import EVENT_TYPES
from gpuloom.events.subjects import subject_for, subject_matches
from gpuloom.events.upcasters import UnknownVersionError, upcast


class MalformedEvent(ValueError):
    """Bytes on the bus that are not a valid gpuloom event."""


@dataclass(frozen=True, slots=True)
class Recorded:
    """An event read from the log at stream sequence `seq`."""

    seq: int
    envelope: Envelope
    event: Event
    #: When the log stored it (JetStream's own timestamp), where the reader knows it:
    #: the fold voids an event whose `at` is far from it (a writer's clock, or a forged
    #: time, must not move the log's clock by years).
    stored_at: datetime | None = None


def read_payload(cls: type[Event], data: dict[str, Any]) -> Event:
    """`cls` from its payload, ignoring fields this version does not know, at any depth.

    A tolerant reader: during a rolling upgrade a newer writer may add an optional
    field (an additive change keeps its VERSION, `gpuloom.events.contract`), and an
    older reader must fold that event as it knows it rather than refuse it. Event
    classes forbid unknown fields themselves, so that the API and the code that
    builds events still reject a misspelt one; only reading is tolerant. Anything
    else wrong with the payload still raises."""
    try:
        return cls.model_validate(data)
    except ValidationError as error:
        unknown = [e["loc"] for e in error.errors() if e["type"] == "extra_forbidden"]
        if not unknown or len(unknown) != error.error_count():
            raise
    known = copy.deepcopy(data)
    for loc in unknown:
        _drop(known, loc)
    return cls.model_validate(known)


def _drop(data: Any, loc: tuple[int | str, ...]) -> None:
    """Delete the item at path `loc` (keys and list indexes) from `data`."""
    *parents, last = loc
    for step in parents:
        data = data[step]
    del data[last]


def new_event_id() -> str:
    """A fresh ULID string, the identity of one envelope."""
    return str(ULID())


def make_envelope(
    event: Event,
    *,
    at: datetime,
    by: str,
    event_id: str | None = None,
    correlation_id: str | None = None,
    causation_id: str | None = None,
) -> Envelope:
    return Envelope(
        id=event_id or new_event_id(),
        type=event.TYPE,
        v=event.VERSION,
        at=at,
        by=by,
        correlation_id=correlation_id,
        causation_id=causation_id,
        data=event.model_dump(mode="json"),
    )


def encode(envelope: Envelope) -> bytes:
    return orjson.dumps(envelope.model_dump(mode="json"))


def decode(
    seq: int, raw: bytes, stored_at: datetime | None = None, *, subject: str | None = None
) -> Recorded:
    """Parse one log entry; raise MalformedEvent with a reason on anything invalid.

    `subject` is the subject the entry was stored under. The bus grants publishing by
    subject (`gpuloom.bus.identities`), so a body that disagrees with its subject (a
    JobPlaced on a JobSubmitted subject, another job's id, another node) is a forgery
    past the server's check and is refused like any malformed entry. Every reader of
    the log passes it; None (pure tests of the codec) skips the check.
    """
    try:
        doc: Any = orjson.loads(raw)
        envelope = Envelope.model_validate(doc)
    except (orjson.JSONDecodeError, ValidationError) as exc:
        raise MalformedEvent(f"seq {seq}: not an event envelope: {exc}") from exc
    cls = EVENT_TYPES.get(envelope.type)
    if cls is None:
        raise MalformedEvent(f"seq {seq}: unknown event type {envelope.type!r}")
    try:
        data = upcast(envelope.type, envelope.v, dict(envelope.data), cls.VERSION)
        event = read_payload(cls, data)
    except (UnknownVersionError, ValidationError) as exc:
        raise MalformedEvent(f"seq {seq}: invalid {envelope.type} payload: {exc}") from exc
    if subject is not None and not subject_matches(event, subject):
        raise MalformedEvent(
            f"seq {seq}: a {envelope.type} on subject {subject!r} belongs on "
            f"{subject_for(event)!r}: the body does not match its subject"
        )
    return Recorded(seq=seq, envelope=envelope, event=event, stored_at=stored_at)

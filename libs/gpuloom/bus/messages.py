"""What moves through the bus, as plain values: a message to publish, one read, the
stream's size. No NATS types here, so that the code around the bus (dead letters, the
follower, the reactor, tests) can name them without importing the adapter.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

#: The most messages a follower of the log (`follow`) holds delivered but not yet
#: folded. A process that folds slower than the server delivers (the gateway writing
#: rows as it replays a long log) would otherwise hold the log itself in memory
#: (a gigabyte for a million events, measured); bounded, it holds a few megabytes
#: and the server keeps the rest.
INBOX_LIMIT = 10_000


@dataclass(frozen=True, slots=True)
class StreamFigures:
    """The stream's size as the server reports it: what `/metrics` shows operators, so
    the log's growth (rate of `bytes`) is watched before the disk fills."""

    messages: int
    bytes: int
    first_seq: int
    last_seq: int
    #: When the stream was created (ISO 8601; "" where the server does not say): which
    #: log this is, since a stream made anew under the same name restarts at seq 1.
    created: str = ""
    #: Its limits (0: none): past them the server drops the oldest events or refuses.
    max_bytes: int = 0
    max_messages: int = 0
    #: The copies it is configured to keep, and those the server reports now (the
    #: leader and each replica it lists; 1 on a single server).
    replicas_wanted: int = 1
    replicas_current: int = 1


@dataclass(frozen=True, slots=True)
class Outgoing:
    """One message to publish: subject, encoded body, headers (Nats-Msg-Id, traceparent)."""

    subject: str
    body: bytes
    headers: dict[str, str]


@dataclass(frozen=True, slots=True)
class Incoming:
    """One message read from the stream."""

    seq: int
    subject: str
    body: bytes
    headers: dict[str, str]
    #: Messages still in the stream after this one when it was delivered.
    pending: int
    #: When the stream stored it (JetStream's own timestamp; None where unknown).
    stored_at: datetime | None = None


#: Why a message was dead-lettered: it did not decode, a fold rule failed on it, its
#: time had to be bounded, or (inventory) a heartbeat that cannot be read.
ReasonKind = Literal["malformed", "fault", "skew", "heartbeat"]


@dataclass(frozen=True, slots=True)
class Received:
    """One core NATS message, not the log's: a heartbeat, a sync or a log request."""

    subject: str
    data: bytes
    #: Answers the request (None: the sender asked no answer).
    respond: Callable[[bytes], Awaitable[None]] | None = None

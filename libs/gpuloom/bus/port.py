"""The log as the runtime sees it: a port, with NATS JetStream behind it in production.

`LogFollower`, `Reactor` and the projector need only this of the bus: the stream's
figures, following it from a sequence, publishing with an intent key, reading one
message, and a place for what they cannot fold. `gpuloom.bus.jetstream.EventBus` is
the adapter to JetStream (the only code that talks to nats-py);
`gpuloom.testing.memlog.MemoryLog` keeps the log in a list, so that the loops can be
unit tested without a server (the integration tests still run them on real NATS).

A process that also talks on core NATS and reads another stream (the agent: its
heartbeats, its syncs and log requests, the per-node view) takes a `Bus`: the log,
`CoreMessages` and `on_stream`, the same two implementations behind it.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from gpuloom.bus.messages import Incoming, Outgoing, ReasonKind, Received, StreamFigures
from gpuloom.events.subjects import ALL_EVENTS

#: What stops a `follow`.
Unfollow = Callable[[], Awaitable[None]]
#: What stops a `serve`.
Unserve = Callable[[], Awaitable[None]]


class DeadLetterSink(Protocol):
    """Where a process puts a message of the log it could not fold (never raises)."""

    def from_log(
        self,
        message: Incoming,
        reason_kind: ReasonKind,
        reason: str,
        envelope_id: str | None = None,
    ) -> None: ...

    async def flush(self, timeout: float) -> None: ...


class Log(Protocol):
    """The event log: one stream, in order, each message once (`Nats-Msg-Id`)."""

    stream: str

    async def stream_figures(self) -> StreamFigures:
        """The stream's size and its first and last sequence."""
        ...

    async def last_seq(self) -> int: ...

    async def publish(self, message: Outgoing, timeout: float = 5.0) -> tuple[int, bool]:
        """Append `message`; (its sequence, whether it was a duplicate of its
        `Nats-Msg-Id`, then the sequence of the first)."""
        ...

    async def publish_many(self, messages: Sequence[Outgoing], timeout: float = 10.0) -> list[int]:
        """Append `messages` in order; their sequences."""
        ...

    async def get(self, seq: int) -> Incoming: ...

    async def follow(
        self,
        on_message: Callable[[Incoming], Awaitable[None]],
        *,
        from_seq: int = 1,
        subjects: str = ALL_EVENTS,
        consumer: str | None = None,
    ) -> Unfollow:
        """Deliver every message from `from_seq` on, in order, then keep following;
        the next is delivered once `on_message` returns."""
        ...

    def dead_letters(self, service: str) -> DeadLetterSink: ...


class CoreMessages(Protocol):
    """Core NATS: messages no stream keeps and nobody acknowledges (heartbeats, the
    agents' syncs, log requests), on the connection the log rides on."""

    @property
    def connected(self) -> bool:
        """Whether the connection is up now (a probe need not wait on a dead one)."""
        ...

    @property
    def max_payload(self) -> int:
        """The largest message the server takes: an answer must fit in it."""
        ...

    async def send(self, subject: str, body: bytes) -> None:
        """Hand `body` to whoever serves `subject` now; lost if nobody does."""
        ...

    async def request(self, subject: str, body: bytes, timeout: float) -> bytes:
        """The first answer of whoever serves `subject`; raises when nobody serves it
        or none answers within `timeout`."""
        ...

    def new_inbox(self) -> str:
        """A subject nobody else serves (this connection's inbox)."""
        ...

    async def serve(self, subject: str, handler: Callable[[Received], Awaitable[None]]) -> Unserve:
        """Hand `handler` every message on `subject` (wildcards allowed), one at a time
        in the order they came; returns what stops it."""
        ...


class Bus(Log, CoreMessages, Protocol):
    """A process's connection: the log, core messages, and the other streams of the
    same server (the agent's per-node view, which the dispatcher writes)."""

    def on_stream(self, stream: str) -> Log:
        """The stream named `stream` on the same connection."""
        ...

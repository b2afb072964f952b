"""The log kept in a list: `gpuloom.bus.port.Log` without a server, for unit tests of the
loops that run on it (`LogFollower`, `Reactor`). It keeps what the loops rely on:

- one order, sequences from 1, each delivered once per follower in that order;
- `Nats-Msg-Id` de-duplication (for ever, where JetStream keeps a window);
- a follower waits for the next message and is delivered the next only once its
  callback returned (the pull consumer's back pressure);
- `pending`: how many messages follow the one delivered, as the server says;
- what a process dead-letters is kept in `letters`.

What it does not: persistence, a second process, reconnects, permissions. The
integration tests run the same loops on real NATS for those.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from gpuloom.bus.identities import subject_matches_pattern
from gpuloom.bus.messages import Incoming, Outgoing, ReasonKind, StreamFigures
from gpuloom.bus.port import Unfollow
from gpuloom.events.subjects import ALL_EVENTS


@dataclass(frozen=True, slots=True)
class Letter:
    """One dead letter, as a process put it."""

    service: str
    seq: int
    reason_kind: ReasonKind
    reason: str


class MemoryDeadLetters:
    def __init__(self, log: MemoryLog, service: str) -> None:
        self.log = log
        self.service = service

    def from_log(
        self,
        message: Incoming,
        reason_kind: ReasonKind,
        reason: str,
        envelope_id: str | None = None,
    ) -> None:
        self.log.letters.append(Letter(self.service, message.seq, reason_kind, reason))

    async def flush(self, timeout: float) -> None:
        return None


class MemoryLog:
    """An event log in memory (module doc)."""

    def __init__(
        self, stream: str = "GPULOOM", clock: Callable[[], datetime] = lambda: datetime.now(UTC)
    ) -> None:
        self.stream = stream
        #: When the log stores a message (its `stored_at`, which bounds an event's time:
        #: a test writing events of another day gives a clock of that day).
        self.clock = clock
        self.messages: list[Incoming] = []
        self.letters: list[Letter] = []
        self._by_msg_id: dict[str, int] = {}
        self._grew = asyncio.Condition()

    async def stream_figures(self) -> StreamFigures:
        last = len(self.messages)
        return StreamFigures(
            messages=last,
            bytes=sum(len(m.body) for m in self.messages),
            first_seq=1 if last else 0,
            last_seq=last,
            created="memory",
        )

    async def last_seq(self) -> int:
        return len(self.messages)

    async def publish(self, message: Outgoing, timeout: float = 5.0) -> tuple[int, bool]:
        msg_id = message.headers.get("Nats-Msg-Id")
        if msg_id is not None and msg_id in self._by_msg_id:
            return self._by_msg_id[msg_id], True
        seq = len(self.messages) + 1
        stored = Incoming(
            seq, message.subject, message.body, dict(message.headers), 0, self.clock()
        )
        self.messages.append(stored)
        if msg_id is not None:
            self._by_msg_id[msg_id] = seq
        async with self._grew:
            self._grew.notify_all()
        return seq, False

    async def publish_many(self, messages: Sequence[Outgoing], timeout: float = 10.0) -> list[int]:
        return [(await self.publish(message, timeout))[0] for message in messages]

    async def get(self, seq: int) -> Incoming:
        if not 1 <= seq <= len(self.messages):
            raise KeyError(f"no message {seq} in {self.stream}")
        return self.messages[seq - 1]

    async def follow(
        self,
        on_message: Callable[[Incoming], Awaitable[None]],
        *,
        from_seq: int = 1,
        subjects: str = ALL_EVENTS,
        consumer: str | None = None,
    ) -> Unfollow:
        async def deliver() -> None:
            seq = max(from_seq, 1)
            while True:
                async with self._grew:
                    while len(self.messages) < seq:
                        await self._grew.wait()
                while seq <= len(self.messages):
                    message = self.messages[seq - 1]
                    seq += 1
                    if not subject_matches_pattern(subjects, message.subject):
                        continue
                    pending = self._pending(seq, subjects)
                    await on_message(
                        Incoming(
                            message.seq,
                            message.subject,
                            message.body,
                            message.headers,
                            pending,
                            message.stored_at,
                        )
                    )

        task = asyncio.create_task(deliver())

        async def unfollow() -> None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

        return unfollow

    def _pending(self, seq: int, subjects: str) -> int:
        """Messages from `seq` on that `subjects` matches."""
        if subjects == ALL_EVENTS:
            return len(self.messages) - seq + 1
        return sum(subject_matches_pattern(subjects, m.subject) for m in self.messages[seq - 1 :])

    def dead_letters(self, service: str) -> MemoryDeadLetters:
        return MemoryDeadLetters(self, service)

"""The log kept in a list: `gpuloom.bus.port.Bus` without a server, for unit tests of the
loops that run on it (`LogFollower`, `Reactor`) and of the agent. It keeps what they
rely on:

- one order, sequences from 1, each delivered once per follower in that order;
- `Nats-Msg-Id` de-duplication (for ever, where JetStream keeps a window);
- a follower waits for the next message and is delivered the next only once its
  callback returned (the pull consumer's back pressure);
- `pending`: how many messages follow the one delivered, as the server says;
- what a process dead-letters is kept in `letters`;
- `state`: the log folded with the one fold (`LogFollower.fold`), as far as it goes;
- core messages (`send`, `request`, `serve`) and other streams (`on_stream`) on one
  `MemoryServer`, which a test can cut off (`connected`); publishes fail on demand
  (`fail_publishes`).

What it does not: persistence, a second process, reconnects, permissions, a stream's
limits (the per-node view keeps every message, not the latest per subject). The
integration tests run the same loops on real NATS for those.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from gpuloom.bus.errors import BusError
from gpuloom.bus.identities import subject_matches_pattern
from gpuloom.bus.messages import Incoming, Outgoing, ReasonKind, Received, StreamFigures
from gpuloom.bus.port import Unfollow, Unserve
from gpuloom.events.subjects import ALL_EVENTS
from gpuloom.runtime.follower import LogFollower
from gpuloom.state import ClusterState

log = logging.getLogger(__name__)

#: nats-server's default `max_payload` (1 MiB).
MAX_PAYLOAD = 1 << 20

Handler = Callable[[Received], Awaitable[None]]


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


class _Subscription:
    """One `serve`: its messages handed over one at a time, in order, as nats-py's
    subscription task does; a handler that raises is logged and the next goes on."""

    def __init__(self, pattern: str, handler: Handler) -> None:
        self.pattern = pattern
        self.handler = handler
        self.inbox: asyncio.Queue[Received] = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            message = await self.inbox.get()
            try:
                await self.handler(message)
            except Exception:
                log.exception("handler of %s failed on %s", self.pattern, message.subject)


class MemoryServer:
    """What the logs of one test share, as processes share a NATS server: the streams
    by name, the subjects served, and whether it can be reached (`connected`: False
    cuts every process off; publishing, sending and asking raise, delivery waits)."""

    def __init__(self, max_payload: int = MAX_PAYLOAD) -> None:
        self.max_payload = max_payload
        self.streams: dict[str, MemoryLog] = {}
        self._subscriptions: list[_Subscription] = []
        self._inboxes = itertools.count(1)
        self._up = asyncio.Event()
        self._up.set()

    @property
    def connected(self) -> bool:
        return self._up.is_set()

    @connected.setter
    def connected(self, up: bool) -> None:
        if up:
            self._up.set()
        else:
            self._up.clear()

    async def reachable(self) -> None:
        """Return once the server can be reached."""
        await self._up.wait()

    def check(self, body: bytes) -> None:
        """Raise as a client does for a message it cannot send now."""
        if not self.connected:
            raise ConnectionError("nats: connection closed")
        if len(body) > self.max_payload:
            raise BusError(f"nats: maximum payload exceeded ({len(body)} > {self.max_payload})")

    def deliver(self, message: Received) -> int:
        """Hand `message` to every subscription its subject matches; how many."""
        matching = [
            s for s in self._subscriptions if subject_matches_pattern(s.pattern, message.subject)
        ]
        for subscription in matching:
            subscription.inbox.put_nowait(message)
        return len(matching)

    async def serve(self, subject: str, handler: Handler) -> Unserve:
        subscription = _Subscription(subject, handler)
        self._subscriptions.append(subscription)

        async def unserve() -> None:
            if subscription in self._subscriptions:
                self._subscriptions.remove(subscription)
            subscription.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await subscription.task

        return unserve

    def new_inbox(self) -> str:
        return f"_INBOX.memory.{next(self._inboxes)}"


class MemoryLog:
    """An event log in memory (module doc)."""

    def __init__(
        self,
        stream: str = "GPULOOM",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        *,
        server: MemoryServer | None = None,
    ) -> None:
        self.stream = stream
        #: When the log stores a message (its `stored_at`, which bounds an event's time:
        #: a test writing events of another day gives a clock of that day).
        self.clock = clock
        self.server = server if server is not None else MemoryServer()
        self.server.streams.setdefault(stream, self)
        self.messages: list[Incoming] = []
        self.letters: list[Letter] = []
        #: The next this many `publish` or `publish_many` calls raise ConnectionError
        #: and store nothing, as when NATS is away.
        self.fail_publishes = 0
        self._by_msg_id: dict[str, int] = {}
        self._grew = asyncio.Event()
        self._fold = LogFollower(None, "memlog")

    # --- the stream ------------------------------------------------------------------

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

    def append(self, message: Outgoing) -> tuple[int, bool]:
        """Store `message` as `publish` does, at once and never failing: a test writes
        the log from synchronous code. (Its sequence, whether it was a duplicate.)"""
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
        grew, self._grew = self._grew, asyncio.Event()
        grew.set()
        return seq, False

    def _publishing(self, messages: Sequence[Outgoing]) -> None:
        """Raise as a publish to a server away does."""
        if self.fail_publishes > 0:
            self.fail_publishes -= 1
            raise ConnectionError("nats: connection closed")
        for message in messages:
            self.server.check(message.body)

    async def publish(self, message: Outgoing, timeout: float = 5.0) -> tuple[int, bool]:
        self._publishing([message])
        return self.append(message)

    async def publish_many(self, messages: Sequence[Outgoing], timeout: float = 10.0) -> list[int]:
        self._publishing(messages)
        return [self.append(message)[0] for message in messages]

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
                while len(self.messages) < seq:
                    await self._grew.wait()
                while seq <= len(self.messages):
                    await self.server.reachable()
                    message = self.messages[seq - 1]
                    seq += 1
                    if not subject_matches_pattern(subjects, message.subject):
                        continue
                    await on_message(replace(message, pending=self._pending(seq, subjects)))

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

    @property
    def state(self) -> ClusterState:
        """The event log folded as every process folds it (`LogFollower.fold`: a message
        that does not decode is skipped), up to its last message: folded as it is read,
        so a test sees what it wrote at once. Kept from read to read."""
        last = len(self.messages)
        for message in self.messages[self._fold.state.seq : last]:
            self._fold.fold(replace(message, pending=last - message.seq))
        return self._fold.state

    # --- the connection: other streams, core messages --------------------------------

    def on_stream(self, stream: str) -> MemoryLog:
        """The stream `stream` of the same server: the same log whenever it is named."""
        if stream not in self.server.streams:
            MemoryLog(stream, self.clock, server=self.server)
        return self.server.streams[stream]

    @property
    def connected(self) -> bool:
        return self.server.connected

    @connected.setter
    def connected(self, up: bool) -> None:
        self.server.connected = up

    @property
    def max_payload(self) -> int:
        return self.server.max_payload

    async def send(self, subject: str, body: bytes) -> None:
        self.server.check(body)
        self.server.deliver(Received(subject, body))

    async def request(self, subject: str, body: bytes, timeout: float) -> bytes:
        self.server.check(body)
        answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        async def respond(data: bytes) -> None:
            self.server.check(data)
            if not answer.done():
                answer.set_result(bytes(data))

        if self.server.deliver(Received(subject, body, respond)) == 0:
            raise BusError("nats: no responders available for request")
        return await asyncio.wait_for(answer, timeout)

    def new_inbox(self) -> str:
        return self.server.new_inbox()

    async def serve(self, subject: str, handler: Handler) -> Unserve:
        return await self.server.serve(subject, handler)

"""Where each stream of `GET /v1/events` gets the log's messages: one follower of the
log's end shared by every stream at the end (the hub), and a follower of its own for a
stream that is behind it.

With a follower per stream, 100 streams meant 100 consumers on the server and each
event pulled, parsed and queued 100 times. Streams that follow the whole log from
its end (the common case: dashboards, `gpuloom watch`) now take each message from the
hub, which pulls it once. A stream that starts further back (a resume, `?after=0`)
reads with its own follower until it reaches the hub's position, then joins the hub;
one that falls `shared_buffer` events behind the hub (a slow reader) leaves it for its own
follower again, from the next sequence it has not taken. Either way each stream gets
every message after its start once, in order: a message at or below the last one it
took is skipped, and a follower it left is ignored from the moment it left.

The hub hands its messages on in batches, at most one per `linger_s` (a message on a
quiet log goes at once): each stream then takes one batch where it took each message,
and streams of one kind (principal and filter) make the batch's bytes once
(`Batch.chunks`). A burst of 350 events a second to 100 streams is 1,000 batches
handed on a second, not 35,000 messages.

A stream of one job (`?job=`) keeps its own follower of that job's subject: the server
reads those events from its subject index, which no hub would make cheaper.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from gpuloom.bus import EventBus, Incoming
from gpuloom.events.subjects import ALL_EVENTS

Stop = Callable[[], Awaitable[None]]


@dataclass(slots=True)
class Batch:
    """Messages of the log in order, as one stream takes them.

    A batch of the hub is shared by every stream at the end: `chunks` keeps what the
    first stream of each kind made of it (a stream of the same kind sends the same)."""

    messages: list[Incoming]
    #: Whether streams may keep what they made of it in `chunks` (a hub's batch).
    shared: bool = False
    chunks: dict[int, bytes] = field(default_factory=dict)

    @property
    def last_seq(self) -> int:
        return self.messages[-1].seq

    def after(self, seq: int) -> Batch:
        """Its messages after `seq` (a stream that joined the hub in its middle)."""
        if self.messages[0].seq > seq:
            return self
        return Batch([message for message in self.messages if message.seq > seq])


class Hub:
    """The shared follower of the log's end; it follows from its first stream on.

    It hands messages on in batches: at most one every `linger_s`, and at most
    `batch_most` messages in one."""

    def __init__(self, linger_s: float = 0.1, batch_most: int = 256) -> None:
        #: The last sequence it received; None until it follows the log.
        self.last_seq: int | None = None
        self.linger_s = linger_s
        self.batch_most = batch_most
        self._feeds: dict[int, Feed] = {}
        self._lock = asyncio.Lock()
        self._stop: Stop | None = None
        self._pending: list[Incoming] = []
        self._timer: asyncio.TimerHandle | None = None
        self._handed_at = float("-inf")

    async def start(self, bus: EventBus) -> None:
        async with self._lock:
            if self.last_seq is None:
                self.last_seq = await bus.last_seq()
                self._stop = await bus.follow(self._deliver, from_seq=self.last_seq + 1)

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._stop is not None:
            with contextlib.suppress(Exception):
                await self._stop()

    async def _deliver(self, message: Incoming) -> None:
        self.last_seq = message.seq
        self._pending.append(message)
        if len(self._pending) >= self.batch_most:
            self._hand_on()
        elif self._timer is None:
            loop = asyncio.get_running_loop()
            # a quiet log's message goes once the follower waits (with the rest of
            # its pull); under load, `linger_s` after the last batch
            wait = max(0.0, self._handed_at + self.linger_s - loop.time())
            self._timer = loop.call_later(wait, self._hand_on)

    def _hand_on(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self._pending:
            return
        batch = Batch(self._pending, shared=True)
        self._pending = []
        self._handed_at = asyncio.get_running_loop().time()
        for feed in list(self._feeds.values()):
            feed.offer(batch)

    def attach(self, feed: Feed) -> None:
        self._feeds[id(feed)] = feed

    def detach(self, feed: Feed) -> None:
        self._feeds.pop(id(feed), None)

    def has(self, feed: Feed) -> bool:
        return id(feed) in self._feeds

    @property
    def streams(self) -> int:
        return len(self._feeds)


class Feed:
    """The messages of one stream after sequence `after`, in order, in batches: `wait`,
    then `take` them.

    Its own follower waits while `buffer` messages wait (they are this stream's own
    copies); the hub's batches are shared by every stream at the end, so a stream
    holds up to `shared_buffer` of their messages (references) before it leaves the
    hub: a client that pauses a few seconds stays on it.

    `slow` is set when its own follower waited `slow_after_s` for room: the stream ends
    then, and the client resumes after `position`."""

    def __init__(
        self,
        bus: EventBus,
        hub: Hub | None,
        after: int,
        *,
        buffer: int,
        shared_buffer: int | None = None,
        slow_after_s: float,
        subjects: str = ALL_EVENTS,
    ) -> None:
        self.bus = bus
        self.hub = hub
        self.subjects = subjects
        self.buffer = buffer
        self.shared_buffer = buffer if shared_buffer is None else shared_buffer
        self.slow_after_s = slow_after_s
        self._inbox: deque[Batch] = deque()
        self._held = 0  # messages in the inbox
        #: The last sequence put in the inbox.
        self.position = after
        self.slow = asyncio.Event()
        #: Set when a message is put in the inbox; `_room` when the reader took some.
        self._arrived = asyncio.Event()
        self._room = asyncio.Event()
        self._generation = 0  # of its own followers: an older one's messages are ignored
        self._own: Stop | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    def empty(self) -> bool:
        return not self._inbox

    @property
    def on_hub(self) -> bool:
        """Whether its messages come from the hub (batched there)."""
        return self.hub is not None and self.hub.has(self)

    def take(self, most: int) -> list[Batch]:
        """The batches that wait, oldest first: at least one, then as long as they hold
        at most `most` messages together."""
        inbox = self._inbox
        taken: list[Batch] = []
        count = 0
        while inbox and (not taken or count + len(inbox[0].messages) <= most):
            batch = inbox.popleft()
            taken.append(batch)
            count += len(batch.messages)
        self._held -= count
        self._room.set()
        return taken

    async def wait(self) -> None:
        """Until the inbox holds a message (or the feed is slow)."""
        while not self._inbox and not self.slow.is_set():
            self._arrived.clear()
            await self._arrived.wait()

    async def start(self) -> None:
        hub = self.hub
        if hub is not None:
            await hub.start(self.bus)
            if hub.last_seq is not None and self.position >= hub.last_seq:
                self._join()
                return
        await self._follow_own()

    async def close(self) -> None:
        self._generation += 1
        if self.hub is not None:
            self.hub.detach(self)
        await self._stop_own()
        for task in list(self._tasks):
            task.cancel()

    def offer(self, batch: Batch) -> None:
        """A batch from the hub (never waits: a full inbox leaves the hub)."""
        if batch.last_seq <= self.position:
            return
        batch = batch.after(self.position)
        if self._held and self._held + len(batch.messages) > self.shared_buffer:
            assert self.hub is not None
            self.hub.detach(self)
            self._spawn(self._follow_own)
            return
        self._add(batch)

    def _add(self, batch: Batch) -> None:
        self._inbox.append(batch)
        self._held += len(batch.messages)
        self.position = batch.last_seq
        self._arrived.set()

    def _join(self) -> None:
        assert self.hub is not None
        self._generation += 1
        self.hub.attach(self)
        self._spawn(self._stop_own)

    async def _follow_own(self) -> None:
        await self._stop_own()
        self._generation += 1
        generation = self._generation

        async def deliver(message: Incoming) -> None:
            if generation != self._generation or self.slow.is_set():
                return
            if message.seq <= self.position:
                return
            await self._put(message)
            hub = self.hub
            if (
                hub is not None
                and generation == self._generation
                and hub.last_seq is not None
                and self.position >= hub.last_seq
            ):
                self._join()  # caught up: the hub's next messages are the ones after

        self._own = await self.bus.follow(
            deliver, from_seq=self.position + 1, subjects=self.subjects
        )

    async def _put(self, message: Incoming) -> None:
        """Put a message of its own follower, waiting for room (not past `slow_after_s`)."""
        if self._held >= self.buffer:
            try:
                async with asyncio.timeout(self.slow_after_s):
                    while self._held >= self.buffer:
                        self._room.clear()
                        await self._room.wait()
            except TimeoutError:
                self.slow.set()
                self._arrived.set()
                return
        self._add(Batch([message]))

    async def _stop_own(self) -> None:
        stop, self._own = self._own, None
        if stop is not None:
            with contextlib.suppress(Exception):
                await stop()

    def _spawn(self, work: Callable[[], Awaitable[None]]) -> None:
        async def run() -> None:
            await work()

        task = asyncio.get_running_loop().create_task(run())
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

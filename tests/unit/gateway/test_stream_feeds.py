"""The stream's ends and its feeds, on a log in memory that grows while streams read
it: every stream gets every event after its start once, in order, whether it starts
at the log's end (the hub), behind it (its own follower, then the hub), or reads too
slowly (back to its own follower, or ended with where to resume)."""

from __future__ import annotations

import asyncio
import random
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gpuloom.auth import OPERATOR
from gpuloom.auth.tokens import Principal
from gpuloom.auth.visibility import Owners, StreamFilter
from gpuloom.bus import EventBus, Incoming
from gpuloom.client.sse import SseEvent, parse_sse
from gpuloom.events import encode, subject_for
from gpuloom.state import ClusterState
from gpuloom.testing.builders import LogBuilder
from services.gateway import stream
from services.gateway.fanout import Feed, Hub
from services.gateway.stream import Streams, event_stream

ROOT = Principal("root", frozenset({OPERATOR}))


class MemoryLog:
    """What the streams need of the bus: the log's figures and followers, which go on
    delivering what is appended."""

    def __init__(self, records: list[Any], first_seq: int = 1) -> None:
        self.messages = [
            Incoming(r.seq, subject_for(r.event), encode(r.envelope), {}, 0) for r in records
        ]
        self.first_seq = first_seq
        self.grown = asyncio.Event()
        self.followers = 0
        self.hub_lags: random.Random | None = None

    def append(self, seq: int, record: Any = None) -> None:
        """A message of sequence `seq`: `record`'s, or one whose body does not decode
        (feeds do not read it)."""
        if record is None:
            self.messages.append(Incoming(seq, "gpuloom.evt.node.n.NodeLost", b"{}", {}, 0))
        else:
            self.messages.append(
                Incoming(seq, subject_for(record.event), encode(record.envelope), {}, 0)
            )
        self.grown.set()
        self.grown = asyncio.Event()

    async def stream_figures(self) -> Any:
        return SimpleNamespace(first_seq=self.first_seq, last_seq=await self.last_seq())

    async def last_seq(self) -> int:
        return self.messages[-1].seq if self.messages else 0

    async def follow(self, deliver: Any, *, from_seq: int, subjects: str = "") -> Any:
        self.followers += 1
        lagging = self.followers == 1 and self.hub_lags is not None  # the first: the hub's

        async def run() -> None:
            at = 0
            while True:
                while at < len(self.messages):
                    message = self.messages[at]
                    at += 1
                    if message.seq >= from_seq:
                        if lagging:  # the hub falls behind streams' own followers
                            assert self.hub_lags is not None
                            await asyncio.sleep(self.hub_lags.random() / 1000)
                        await deliver(message)
                await self.grown.wait()

        task = asyncio.create_task(run())

        async def stop() -> None:
            task.cancel()

        return stop


def events_of(chunks: list[bytes]) -> list[SseEvent]:
    text = b"".join(chunks).decode()
    return list(parse_sse(text.split("\n")))


def stream_of(log: MemoryLog, after: int, shared: Streams | None = None) -> Any:
    owners = Owners(lambda: ClusterState(), _no_owner)
    return event_stream(cast(EventBus, log), after, StreamFilter(), ROOT, owners, dict, shared)


async def _no_owner(job_id: str) -> None:
    return None


async def test_a_position_the_log_no_longer_holds_gets_an_error_event() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    got = events_of([c async for c in stream_of(MemoryLog(log.records, first_seq=50), after=10)])
    assert [(e.event, e.data) for e in got] == [
        ("error", '{"reason":"gone","detail":"the log no longer holds the events after seq 10: '
         'it starts at seq 50 (older events are in its archive)","resume_after":49}'),
    ]  # fmt: skip


async def test_a_client_that_takes_nothing_is_ended_with_where_to_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream, "BUFFER", 2)
    monkeypatch.setattr(stream, "SLOW_AFTER_S", 0.05)
    log = LogBuilder()
    for i in range(6):
        log.register(f"n{i}", 1)
    chunks = stream_of(MemoryLog(log.records), after=0)
    opened = await anext(chunks)
    first = await anext(chunks)
    await asyncio.sleep(0.2)  # the client reads nothing: the buffer fills, then it is slow
    got = events_of([opened, first] + [c async for c in chunks])
    assert (got[0].event, got[0].id) == ("open", "0")
    ids = [int(e.id or 0) for e in got[1:-1]]
    assert ids == list(range(1, len(ids) + 1)) and 3 <= len(ids) < 6  # some, in order
    assert got[-1].event == "error" and f'"resume_after":{ids[-1]}' in got[-1].data


@pytest.mark.parametrize("hub_lags", [False, True])
async def test_every_stream_gets_every_event_once_in_order_wherever_it_starts(
    hub_lags: bool,
) -> None:
    """Streams start at the end, behind it, and read slowly, while the log grows (and
    the hub, when it lags, is behind streams that join it)."""
    log = MemoryLog([])
    log.hub_lags = random.Random(3) if hub_lags else None
    for seq in range(1, 41):
        log.append(seq)
    hub = Hub(linger_s=0.002, batch_most=5)
    await hub.start(cast(EventBus, log))  # at 40
    for seq in range(41, 61):  # the log goes on before the hub delivered any of it
        log.append(seq)
    chance = random.Random(7)
    feeds = []
    for start in (40, 60, 55, 0, 10, 39, 25):  # 55, 60: ahead of the hub, which is at 40
        feed = Feed(cast(EventBus, log), hub, start, buffer=4, slow_after_s=30)
        await feed.start()
        feeds.append((start, feed))
    got: dict[int, list[int]] = {i: [] for i in range(len(feeds))}

    async def read(i: int, feed: Feed, slow: bool) -> None:
        while not got[i] or got[i][-1] < 200:
            await feed.wait()
            got[i] += [m.seq for batch in feed.take(3) for m in batch.messages]
            if slow:
                await asyncio.sleep(chance.random() / 500)

    readers = [
        asyncio.create_task(read(i, feed, slow=i % 2 == 0)) for i, (_, feed) in enumerate(feeds)
    ]
    for seq in range(61, 201):
        log.append(seq)
        if seq % 7 == 0:
            await asyncio.sleep(0.001)
    await asyncio.wait_for(asyncio.gather(*readers), 10)
    for i, (start, feed) in enumerate(feeds):
        assert got[i] == list(range(start + 1, 201)), (i, start)
        await feed.close()
    assert hub.streams == 0
    await hub.close()


async def test_streams_at_the_end_share_one_follower() -> None:
    log = MemoryLog([])
    log.append(1)
    shared = Streams()
    streams = [stream_of(log, after=1, shared=shared) for _ in range(5)]
    opened = [await anext(s) for s in streams]
    assert all(b"event: open" in chunk for chunk in opened)
    assert log.followers == 1 and shared.hub.streams == 5  # the hub's, and no other
    for s in streams:
        await s.aclose()
    assert shared.hub.streams == 0
    await shared.hub.close()


async def test_streams_of_one_kind_make_each_batch_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """Five operators' streams at the log's end: each event is decoded, decided and
    encoded once for them all, and each gets the same bytes."""
    built = LogBuilder()
    for i in range(30):
        built.register(f"n{i}", 1)
    log = MemoryLog(built.records[:1])
    shared = Streams()
    made = shared.decoded.of
    decoded: list[int] = []

    def counted(message: Incoming) -> Any:
        decoded.append(message.seq)
        return made(message)

    monkeypatch.setattr(shared.decoded, "of", counted)
    streams = [stream_of(log, after=1, shared=shared) for _ in range(5)]
    for s in streams:
        await anext(s)
    for record in built.records[1:]:
        log.append(record.seq, record)
        if record.seq % 10 == 0:
            await asyncio.sleep(0.01)
    got = []
    for s in streams:
        chunks: list[bytes] = []
        while not chunks or events_of(chunks)[-1].id != str(built.records[-1].seq):
            chunks.append(await asyncio.wait_for(anext(s), 5))
        got.append(b"".join(chunks))
        await s.aclose()
    await shared.hub.close()
    assert [int(e.id or 0) for e in events_of([got[0]])] == [r.seq for r in built.records[1:]]
    assert got == [got[0]] * 5
    assert sorted(decoded) == [r.seq for r in built.records[1:]]  # once each, not five times

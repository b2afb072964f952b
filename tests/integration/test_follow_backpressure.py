"""A follower of the log that folds slower than the server delivers holds a bounded
inbox, and loses or reorders nothing for it: the gateway replaying a long log into
its database held the whole log in memory before (1 GiB for a million events).
Real NATS, real SQLite."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from projection_helpers import put, submit
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus import EventBus, Incoming
from gpuloom.bus.follower import BATCH
from gpuloom.events import Decision
from gpuloom.runtime.projector import Projector
from gpuloom.runtime.reactor import Reactor
from gpuloom.state import ClusterState, JobState
from gpuloom.store import rows
from gpuloom.store.models import JobRow

pytestmark = pytest.mark.integration

EVENTS = 1500
LIMIT = 40


async def fill(bus: EventBus) -> int:
    return await put(bus, *(submit(f"bp-{i:05d}") for i in range(EVENTS)))


async def watch(inbox: asyncio.Queue[Any], done: Any, timeout: float = 60) -> int:
    """The most messages `inbox` held until `done()`."""
    most = 0
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the follower never caught up"
        most = max(most, inbox.qsize())
        await asyncio.sleep(0.002)
    return most


async def test_a_slow_projection_holds_a_bounded_inbox_and_writes_every_row(
    sessions: async_sessionmaker[Any], bus: EventBus
) -> None:
    last = await fill(bus)

    def slow_row(job: JobState, state: ClusterState) -> dict[str, Any]:
        time.sleep(0.001)  # a database slower than the log's delivery
        return rows.job_row(job, state)

    stop = asyncio.Event()
    projector = Projector(bus, sessions, job_row=slow_row, inbox_limit=LIMIT)
    task = asyncio.create_task(projector.run(stop))
    try:
        most = await watch(projector.follower._inbox, lambda: projector.written_seq >= last)
    finally:
        stop.set()
        await task
    assert 0 < most <= LIMIT
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(JobRow)) == EVENTS
        first = await session.get(JobRow, "bp-00000")
        assert first is not None and first.last_seq == 1


async def test_a_slow_reactor_holds_a_bounded_inbox_and_folds_every_event(bus: EventBus) -> None:
    last = await fill(bus)
    seen: list[int] = []

    async def decide(state: ClusterState) -> list[Decision]:
        seen.append(state.seq)
        return []

    stop = asyncio.Event()
    reactor = Reactor(bus, "queue", decide, inbox_limit=LIMIT)
    original = reactor.follower.fold

    def slow_fold(message: Any) -> None:
        time.sleep(0.0005)
        original(message)

    reactor.follower.fold = slow_fold  # type: ignore[method-assign]
    task = asyncio.create_task(reactor.run(stop))
    try:
        most = await watch(reactor.follower._inbox, lambda: reactor.state.seq >= last)
        await asyncio.wait_for(reactor.caught_up.wait(), 10)
    finally:
        stop.set()
        await task
    assert 0 < most <= LIMIT
    assert sorted(reactor.state.submitted) == [f"bp-{i:05d}" for i in range(EVENTS)]
    assert seen and seen[0] == last  # it decided once, caught up, on the whole log


async def test_the_server_sends_a_slow_follower_at_most_a_batch_ahead(bus: EventBus) -> None:
    """Below the inbox: how far ahead of what the follower took the server has sent
    (its consumer's delivered sequence). An ordered push consumer let the server send
    the whole log into nats-py's queue (flow control answered as messages arrived,
    not as they were taken)."""
    last = await fill(bus)
    seen: list[int] = []
    ahead = 0

    async def slow(message: Incoming) -> None:
        nonlocal ahead
        if message.seq % 50 == 0:
            for info in await bus.js.consumers_info(bus.stream):
                if info.config.durable_name is None and info.delivered is not None:
                    sent = int(info.delivered.stream_seq or 0)
                    ahead = max(ahead, sent - message.seq)
        seen.append(message.seq)
        await asyncio.sleep(0.0005)

    stop = await bus.follow(slow)
    try:
        deadline = time.monotonic() + 60
        while not seen or seen[-1] < last:
            assert time.monotonic() < deadline, "the follower never caught up"
            await asyncio.sleep(0.01)
    finally:
        await stop()
    assert seen == list(range(1, last + 1))
    assert 0 < ahead <= 2 * BATCH, ahead

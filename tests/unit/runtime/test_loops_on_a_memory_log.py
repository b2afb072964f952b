"""The loops every process runs, on the log kept in memory (`gpuloom.testing.memlog`):
the follower folds what the log holds and dead-letters what it cannot read; a reactor
decides once caught up, one started again decides nothing twice, and a decision
published again is kept once (its intent key). The same loops run on real NATS in the
integration tests."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from gpuloom.bus.messages import Outgoing
from gpuloom.decide.admission import decide_admission
from gpuloom.events import decode, encode, subject_for
from gpuloom.runtime.follower import LogFollower
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.state import fold
from gpuloom.testing.builders import LogBuilder
from gpuloom.testing.memlog import MemoryLog


async def write(log: MemoryLog, built: LogBuilder) -> None:
    """Publish what `built` holds, as the writers would have."""
    for recorded in built:
        body = encode(recorded.envelope)
        await log.publish(Outgoing(subject_for(recorded.event), body, {}))


def cluster_with_a_submission() -> LogBuilder:
    """A node and a job, written a moment ago (the reactor's decisions are stamped now,
    and the log bounds an event's time by when it stored it)."""
    built = LogBuilder(start=datetime.now(UTC) - timedelta(seconds=5))
    built.register("n1", 2)
    built.submit("j1", gpus=1)
    return built


async def until(condition: object, timeout: float = 5.0) -> None:
    async def wait() -> None:
        while not condition():  # type: ignore[operator]
            await asyncio.sleep(0.01)

    await asyncio.wait_for(wait(), timeout)


async def test_the_follower_folds_the_log_and_dead_letters_what_it_cannot_read() -> None:
    log, built = MemoryLog(), cluster_with_a_submission()
    await write(log, built)
    await log.publish(Outgoing("gpuloom.evt.job.j2.JobSubmitted", b"not json", {}))
    follower, stop = LogFollower(log, "queue"), asyncio.Event()
    await follower.start(stop)
    try:
        while not follower.is_caught_up():
            await follower.fold_next(1.0)
    finally:
        await follower.close()
    assert follower.state.seq == 3
    assert follower.state.jobs.keys() == fold(built).jobs.keys() == {"j1"}
    [letter] = log.letters
    assert (letter.service, letter.seq, letter.reason_kind) == ("queue", 3, "malformed")


async def test_a_reactor_decides_once_caught_up_and_a_restart_decides_nothing_again() -> None:
    log = MemoryLog()
    await write(log, cluster_with_a_submission())

    async def run_once() -> None:
        stop = asyncio.Event()
        reactor = Reactor(log, "admission", pure(decide_admission), tick_s=0.05)
        task = asyncio.create_task(reactor.run(stop))
        try:
            await until(lambda: reactor.caught_up.is_set() and reactor.is_caught_up())
            await until(
                lambda: "j1" in reactor.state.jobs and reactor.state.jobs["j1"].phase == "admitted"
            )
        finally:
            stop.set()
            await asyncio.wait_for(task, 5)

    await run_once()
    types = [decode(m.seq, m.body).envelope.type for m in log.messages]
    assert types[-1].endswith("JobAdmitted") and len(types) == 3
    await run_once()  # started again: it re-reads the log and finds the job answered
    assert len(log.messages) == 3
    assert not log.letters


async def test_a_decision_published_again_is_kept_once_by_its_intent_key() -> None:
    """What a reactor that crashed between publishing and folding does on restart."""
    log = MemoryLog()
    await write(log, cluster_with_a_submission())
    reactor = Reactor(log, "admission", pure(decide_admission))
    decisions = decide_admission(fold(cluster_with_a_submission()))
    assert len(decisions) == 1
    first = await reactor.publish(decisions)
    assert await reactor.publish(decisions) == first
    assert len(log.messages) == 3

"""`cancel_and_wait` stops a task that drops a cancellation (a CI run hung 300 s on a
log follower that did: `gpuloom.tasks`)."""

from __future__ import annotations

import asyncio
import logging
import sys

import pytest

from gpuloom.tasks import cancel_and_wait


async def test_a_cancellation_dropped_by_wait_for_is_made_again() -> None:
    """The cause itself: the awaited reply and the cancellation land in the same turn
    of the loop, and (before Python 3.12) `wait_for` returns the reply instead."""
    reply: asyncio.Future[str] = asyncio.get_running_loop().create_future()
    went_on = asyncio.Event()

    async def follower() -> None:
        await asyncio.wait_for(reply, 10)  # nats-py's request
        went_on.set()
        await asyncio.sleep(2)  # follows the log on, as if never asked to stop

    task = asyncio.create_task(follower())
    await asyncio.sleep(0)  # it waits for the reply
    reply.set_result("consumer made")
    await asyncio.wait_for(cancel_and_wait(task, grace_s=0.05), 5)
    assert task.cancelled() and went_on.is_set() == (sys.version_info < (3, 12))


async def test_a_task_that_runs_on_after_one_cancellation_is_cancelled_again() -> None:
    cancellations = 0

    async def stubborn() -> None:
        nonlocal cancellations
        for _ in range(20):  # then it ends by itself (not cancelled): the test fails
            try:
                await asyncio.sleep(0.1)
            except asyncio.CancelledError:
                cancellations += 1
                if cancellations == 3:
                    raise

    task = asyncio.create_task(stubborn())
    await asyncio.sleep(0)
    await asyncio.wait_for(cancel_and_wait(task, grace_s=0.05), 5)
    assert task.cancelled() and cancellations == 3


async def test_a_clean_up_within_the_grace_is_not_cut_short() -> None:
    cleaned = asyncio.Event()

    async def tidy() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(0.1)  # deleting its consumer
            cleaned.set()

    task = asyncio.create_task(tidy())
    await asyncio.sleep(0)
    await cancel_and_wait(task, grace_s=2)
    assert cleaned.is_set() and task.cancelled()


async def test_ended_tasks_and_errors_while_stopping(caplog: pytest.LogCaptureFixture) -> None:
    async def fails_on_stop() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            raise RuntimeError("could not close")

    done = asyncio.create_task(asyncio.sleep(0))
    await done
    failing = asyncio.create_task(fails_on_stop())
    await asyncio.sleep(0)
    with caplog.at_level(logging.ERROR, logger="gpuloom.tasks"):
        await cancel_and_wait(done, failing)
    assert "could not close" in caplog.text
    await cancel_and_wait()  # nothing to stop

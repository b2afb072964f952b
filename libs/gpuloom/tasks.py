"""Stopping asyncio tasks for sure.

`task.cancel()` followed by `await task` waits for ever when the task drops the
cancellation and runs on. Before Python 3.12 `asyncio.wait_for` does exactly that when
the awaited result and the cancellation land in the same turn of the loop: it returns
the result, and the cancellation is gone (CPython gh-86296). nats-py awaits every
request through `wait_for`, so a log follower stopped while its consumer was being
made could run on, and the process stopping it hung (a CI run waited 300 s for it).

`cancel_and_wait` cancels again while the task is still running after a grace period
long enough for its own clean-up (each bounded well under it) to finish.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

log = logging.getLogger(__name__)

#: How long a cancelled task may take to end (its clean-up) before it is cancelled
#: again, seconds: longer than any clean-up a stopping task does (2 s at most).
GRACE_S = 5.0


async def cancel_and_wait(*tasks: asyncio.Future[Any], grace_s: float = GRACE_S) -> None:
    """Cancel `tasks` and return once every one has ended, cancelling again each
    `grace_s` seconds those still running. What a task raised other than its
    cancellation is logged (it ends, but nothing else would see it)."""
    running = {task for task in tasks if not task.done()}
    while running:
        for task in running:
            task.cancel()
        _, running = await asyncio.wait(running, timeout=grace_s)
        for task in running:
            log.warning("%r ran on after it was cancelled: cancelling it again", task)
    for task in tasks:
        if not task.cancelled() and task.exception() is not None:
            log.error("%r ended with an error while stopping", task, exc_info=task.exception())

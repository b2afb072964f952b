"""Run the parts of an audit side by side, each but the last in a process forked for it,
and gather what each found.

Why processes: re-making the decisions of a long log is CPU-bound Python, one core's
work however many the machine has. The decisions of different cycles do not depend on
each other (each is a function of the log up to its basis), so contiguous runs of
cycles can be re-made side by side. This process folds the log once: at the start of
each run it forks a child to re-make that run (the child folds on only within it) and
folds on to the next run's start itself, and re-makes the last run.

Why `fork`: a child starts with the parent's log already read and folded
(copy-on-write), where `spawn` would pickle hundreds of thousands of events and the
state to each child first. Forking a process that runs other threads can deadlock the
child (a lock held by a thread that does not exist there), so `can_fork` refuses then
and the audit runs in one process.
What a child sends back is small (counts, mismatch lines, snapshot checks), pickled
through a pipe; a child that fails makes the whole audit fail with its traceback.
"""

from __future__ import annotations

import gc
import os
import pickle
import signal
import threading
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

Part = TypeVar("Part")
Found = TypeVar("Found")


class WorkerFailed(RuntimeError):
    """A forked part of the audit raised or died; the message holds its traceback."""


def can_fork() -> bool:
    """Fork is there and this process runs no other thread (so a child cannot deadlock)."""
    return hasattr(os, "fork") and threading.active_count() == 1


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def run_parts(
    parts: Sequence[Part],
    check: Callable[[Part], Found],
    prepare: Callable[[Part], object] = lambda part: None,
) -> list[Found]:
    """`[check(part) for part in parts]` (`parts` not empty), each but the last in a
    child forked for it, the last in this process; the results in the parts' order.

    Before each fork, and before checking the last part, this process runs
    `prepare(part)`: a child starts from what it did (the log folded up to the
    part), so work the parts share is done once, here, and never twice."""
    pending: list[tuple[int, int]] = []  # (pid, read end of its pipe), not yet gathered
    try:
        for part in parts[:-1]:
            prepare(part)
            pending.append(_fork(check, part))
        prepare(parts[-1])
        last = check(parts[-1])
        found = []
        while pending:
            pid, pipe = pending.pop(0)
            found.append(_gather(pid, pipe))
        return [*found, last]
    finally:
        for pid, pipe in pending:  # this process failed first: stop the rest
            os.close(pipe)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic cycle collection inside; as it was after.

    Re-making a long log's decisions allocates millions of objects that live on (jobs,
    views, heap entries), and each young collection walks every object that survived
    since the last one, to free nothing (docs/benchmarks.md, run G). The audit makes no
    garbage cycles (a test holds it to that), so reference counting frees all it drops
    and nothing waits for a collection.
    Forked parts inherit the pause.

    At the end, what survived moves to the oldest generation without being walked
    (`gc.freeze` then `gc.unfreeze`, unless something else froze objects): otherwise the
    first young collection after the pause would walk all of it at once, a second.
    """
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if gc.get_freeze_count() == 0:
            gc.freeze()
            gc.unfreeze()
        if enabled:
            gc.enable()


def _fork(check: Callable[[Part], Found], part: Part) -> tuple[int, int]:
    read, write = os.pipe()
    pid = os.fork()
    if pid:
        os.close(write)
        return pid, read
    # the child: never return into the caller's code, never run its exit handlers
    os.close(read)
    status = 0
    try:
        payload = pickle.dumps((True, check(part)))
    except BaseException:
        payload = pickle.dumps((False, traceback.format_exc()))
        status = 1
    try:
        with os.fdopen(write, "wb") as out:
            out.write(payload)
    finally:
        os._exit(status)


def _gather(pid: int, pipe: int) -> Any:
    with os.fdopen(pipe, "rb") as stream:
        data = stream.read()
    _, status = os.waitpid(pid, 0)
    if not data:
        raise WorkerFailed(f"an audit process ended without a result ({_ended(status)})")
    ok, result = pickle.loads(data)  # written by our own child, through our own pipe
    if not ok:
        raise WorkerFailed(f"an audit process failed:\n{result}")
    return result


def _ended(status: int) -> str:
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    return f"exit status {os.waitstatus_to_exitcode(status)}"

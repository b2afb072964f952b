"""Read-your-writes is per caller: a read waits for the caller's own writes through
this gateway to reach the read model, never for another user's (issue #36: one
user's burst of writes held every other user's reads up while the rows caught up)."""

from __future__ import annotations

from typing import Any

from gpuloom.config import Settings
from gpuloom.testing.builders import LogBuilder
from services.gateway.parts import Gateway, WriteMarks
from services.gateway.readmodel import ReadModel
from services.gateway.reads import Reads


def gateway_at(folded: int, written: int) -> Gateway:
    """A gateway whose fold holds `folded` events and whose rows reach `written`."""
    log = LogBuilder()
    for index in range(folded):
        log.submit(f"j{index}", gpus=0)
    read_model = ReadModel(bus=None, sessions=None)  # type: ignore[arg-type]
    read_model.follower.state = log.state()
    read_model.written_seq = written
    settings = Settings(read_your_writes_timeout_s=0.05)
    return Gateway(settings=settings, sessions=None, read_model=read_model)  # type: ignore[arg-type]


async def test_a_read_waits_for_the_callers_writes_and_not_for_anothers() -> None:
    gateway = gateway_at(folded=3, written=1)
    gateway.writes.wrote("mallory", 3)
    reads = Reads(gateway)
    assert await reads.catch_up("alice")  # nothing of hers in flight: no wait
    assert not await reads.catch_up("mallory")  # her write is folded, not yet in the rows
    assert gateway.writes.last("mallory") == 3


async def test_a_caller_is_forgotten_once_the_read_model_has_their_writes() -> None:
    gateway = gateway_at(folded=3, written=3)
    gateway.writes.wrote("mallory", 2)
    assert await Reads(gateway).catch_up("mallory")
    assert gateway.writes.last("mallory") == 0


async def test_a_new_limit_holds_for_the_next_submission_of_anyone() -> None:
    """An operator's write (a limit) is folded before another user's submission is
    checked: that wait is on the fold of everyone's writes, not on the rows."""
    gateway = gateway_at(folded=3, written=0)
    gateway.writes.wrote("ops", 3)
    read_model: Any = gateway.read_model
    assert await read_model.wait_folded(gateway.writes.latest, 0.05)
    gateway.writes.wrote("ops", 4)
    assert not await read_model.wait_folded(gateway.writes.latest, 0.05)


def test_the_marks_keep_each_callers_last_write_and_are_bounded() -> None:
    marks = WriteMarks()
    marks.wrote("alice", 5)
    marks.wrote("alice", 4)  # acks may come back out of order
    assert (marks.last("alice"), marks.latest) == (5, 5)
    for index in range(WriteMarks.MOST + 10):
        marks.wrote(f"user-{index}", 10 + index)
    assert len(marks._last) == WriteMarks.MOST
    assert marks.last("alice") == 0  # the oldest mark went first
    assert marks.last(f"user-{WriteMarks.MOST + 9}") == WriteMarks.MOST + 19
    marks.reached("user-20", 29)
    assert marks.last("user-20") == 30, "a write past what the read model reached is kept"
    marks.reached("user-20", 30)
    assert marks.last("user-20") == 0

"""Time limits at the contract's maximum, and reservations past year 9999, never raise.

Issue #9: a job with `time_limit_s` of 3e11 put its reservation past year 9999, and
the placement cycle raised OverflowError in every round, so no job anywhere was
placed, and explain answered 500. The contract now bounds time limits to a 32-bit
number of seconds; the cycle must also survive the largest of them.
"""

from __future__ import annotations

from datetime import UTC, datetime

from gpuloom.decide.explain import explain
from gpuloom.events import JobReserved
from gpuloom.events.text import INT32_MAX
from gpuloom.placement import BestFit, placement_cycle
from gpuloom.placement.inputs import LAST_MS, from_ms
from gpuloom.testing.builders import LogBuilder


def test_a_blocked_high_class_job_behind_the_longest_time_limit_gets_a_reservation() -> None:
    log = LogBuilder()
    log.register("n1", 2, "A100-80GB")
    log.run_to_queue("forever", gpus=2, time_limit_s=INT32_MAX)
    log.record_decisions(placement_cycle(log.state(), BestFit()))
    log.start("forever", "n1")
    log.run_to_queue("urgent", priority=1_000_000, gpus=2, time_limit_s=INT32_MAX)
    log.run_to_queue("small", gpus=0, time_limit_s=60)
    decisions = placement_cycle(log.state(), BestFit())
    reserved = [d.event for d in decisions if isinstance(d.event, JobReserved)]
    assert [r.job_id for r in reserved] == ["urgent"]
    assert reserved[0].start_at.year > 2090
    placed = {d.event.job_id for d in decisions if not isinstance(d.event, JobReserved)}
    assert placed == {"small"}, "a job that does not touch the reservation still runs"
    log.record_decisions(decisions)
    found = explain(log.state(), "urgent")
    assert found is not None and found.estimated_start is not None
    assert found.estimated_start.year > 2090


def test_a_time_past_year_9999_is_year_9999s_end() -> None:
    assert from_ms(LAST_MS * 10) == datetime.max.replace(tzinfo=UTC).replace(microsecond=999000)

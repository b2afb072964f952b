"""The queueing what-if (`gpuloom.sim.queue_sim`) on a hand-made trace."""

from __future__ import annotations

from gpuloom.placement.policies import BestFit
from gpuloom.sim.queue_sim import TimedTask, simulate
from gpuloom.sim.trace import TraceNode, TraceTask

NODES = [TraceNode("n0", 64_000, 256_000, 4, "A100")]


def task(name: str, gpus: int, arrival: int, runtime: int, priority: int = 0) -> TimedTask:
    return TimedTask(TraceTask(name, 1000, 1024, gpus, 1000, ()), arrival, runtime, priority)


TRACE = [
    task("a", 2, 0, 100),  # limit 120 s
    task("b", 4, 10, 10, priority=2),  # blocked by a: reserved for t=120 (a's limit)
    task("c", 1, 11, 30),  # limit 60: ends by 71, before b's reservation
]


def waits(mode: str) -> dict[int, list[int]]:
    return simulate(NODES, TRACE, BestFit(), mode).waits_by_class


def test_strict_order_makes_the_short_job_wait_behind_the_blocked_one() -> None:
    run = simulate(NODES, TRACE, BestFit(), "fifo")
    assert sorted(run.waits_s) == [0, 90, 99]  # a; b starts when a ends; c after b
    assert run.backfilled == 0


def test_easy_backfill_starts_the_short_job_without_delaying_the_blocked_one() -> None:
    run = simulate(NODES, TRACE, BestFit(), "priority+backfill")
    assert sorted(run.waits_s) == [0, 0, 90], "c starts at once, b still when a ends"
    assert run.backfilled == 1
    assert run.waits_by_class[2] == [90]


def test_utilisation_is_time_weighted_allocation() -> None:
    run = simulate(NODES, TRACE, BestFit(), "priority+backfill")
    # a holds 2 of 4 GPUs over [0, 100), c 1 over [11, 41), b 4 over [100, 110)
    expected = (2000 * 100 + 1000 * 30 + 4000 * 10) / (4000 * 110)
    assert abs(run.utilisation(0, 110) - expected) < 1e-9

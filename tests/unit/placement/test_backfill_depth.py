"""A placement pass tries at most `QueuePolicySet.backfill_depth` queued jobs behind the
first that cannot start (Slurm's `bf_max_job_test`): a deep backlog costs each pass a
bounded walk. Logs without it try every job, as they were decided."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuloom.audit import audit
from gpuloom.config import Settings
from gpuloom.decide.explain import explain
from gpuloom.events import JobPlaced, QueuePolicySet
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.policies import BestFit
from gpuloom.queueing.order import queue_order
from gpuloom.testing.builders import LogBuilder
from services.queue.__main__ import configured_policy


def blocked_head_and_singles(depth: int | None) -> LogBuilder:
    """One node of 4 GPUs; the head asks for 8 (it never starts), then 4 one-GPU jobs."""
    log = LogBuilder()
    log.append(QueuePolicySet(victims_yield=True, backfill_depth=depth))
    log.register("n1", 4)
    log.run_to_queue("huge", gpus=8, priority=9)
    for number in range(4):
        log.run_to_queue(f"s{number}", gpus=1)
    return log


def placed_by_one_cycle(log: LogBuilder) -> list[str]:
    decisions = placement_cycle(log.state(), BestFit())
    for decision in decisions:
        log.append(decision.event)
    return [d.event.job_id for d in decisions if isinstance(d.event, JobPlaced)]


@pytest.mark.parametrize(
    ("depth", "placed"),
    [(None, ["s0", "s1", "s2", "s3"]), (4, ["s0", "s1", "s2", "s3"]), (2, ["s0", "s1"])],
)
def test_a_pass_tries_only_so_many_jobs_behind_the_blocked_one(
    depth: int | None, placed: list[str]
) -> None:
    log = blocked_head_and_singles(depth)
    assert placed_by_one_cycle(log) == placed
    report = audit(log.records)
    assert report.ok and report.verified == len(placed), report.mismatches


def test_the_next_pass_reaches_the_jobs_behind_once_those_ahead_were_placed() -> None:
    log = blocked_head_and_singles(2)
    assert placed_by_one_cycle(log) == ["s0", "s1"]
    assert placed_by_one_cycle(log) == ["s2", "s3"]
    assert audit(log.records).verified == 4


def test_explain_names_the_depth_for_a_job_beyond_it() -> None:
    log = blocked_head_and_singles(1)
    state = log.state()
    deep = explain(state, "s3")
    assert deep is not None and deep.reason == "Priority"
    assert "at most 1 jobs behind" in (deep.detail or "")
    near = explain(state, "s0")
    assert near is not None and "backfill depth" not in (near.detail or "")


def test_the_queue_service_records_the_configured_depth() -> None:
    assert configured_policy(Settings()).backfill_depth == 500, "Slurm's bf_max_job_test"
    assert configured_policy(Settings(backfill_depth=0)).backfill_depth is None
    assert configured_policy(Settings(backfill_depth=20)).backfill_depth == 20


@settings(max_examples=60, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=14),
    depth=st.integers(1, 4),
)
def test_a_pass_places_nothing_further_than_its_depth_behind_the_first_blocked_job(
    sizes: list[int], depth: int
) -> None:
    """Random queues of jobs of 1 to 5 GPUs on two nodes of 4: every job a pass with a
    depth places is at most `depth` places behind the first job it could not start, or
    before it; with a depth as long as the queue it decides as without one; the audit
    re-makes both."""

    def cycle(with_depth: int | None) -> tuple[list[str], list[str], LogBuilder]:
        log = LogBuilder()
        log.append(QueuePolicySet(victims_yield=True, backfill_depth=with_depth))
        for node in ("n1", "n2"):
            log.register(node, 4)
        for number, gpus in enumerate(sizes):
            log.run_to_queue(f"j{number:02d}", gpus=gpus)
        order = [job.job_id for job in queue_order(log.state())]
        return order, placed_by_one_cycle(log), log

    order, unbounded, _ = cycle(None)
    _, placed, log = cycle(depth)
    assert audit(log.records).ok
    blocked = next((i for i, job in enumerate(order) if job not in unbounded), len(order))
    assert placed == [j for j in unbounded if order.index(j) <= blocked + depth]
    _, long_enough, _ = cycle(len(sizes))
    assert long_enough == unbounded

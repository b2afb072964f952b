"""A job preempted and requeued ranks behind the job it was stopped for, while that job
waits (`QueuePolicySet.victims_yield`): else, ranked first by age or fair share, it
took back what it was stopped to free and was preempted again, a dozen times in the
golden log of 2026-12-04 (seq 102 to 211), whose decisions still audit as made."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from gpuloom.auth import OPERATOR, Principal
from gpuloom.config import Settings
from gpuloom.decide.explain import explain
from gpuloom.events import JobPlaced, JobPreempted, PriorityClassSet, QueuePolicySet
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.policies import BestFit
from gpuloom.queueing.order import queue_order
from gpuloom.testing.builders import LogBuilder
from services.gateway.cluster.routes import queue
from services.gateway.parts import Gateway
from services.gateway.reads import Reads
from services.queue.__main__ import configured_policy


def urgent_job_for_a_full_node(victims_yield: bool) -> LogBuilder:
    """n1's 4 GPUs run `old` (preemptible, normal class, an hour in the queue: the age
    factor ranks it above `urgent`'s class priority); `urgent` needs 2 of them."""
    log = LogBuilder()
    log.append(QueuePolicySet(weight_age=10_000, max_age_s=60, victims_yield=victims_yield))
    log.append(PriorityClassSet(name="urgent", priority=1000))
    log.register("n1", 4)
    log.run_to_queue("old", gpus=4, preemptible=True)
    log.place("old", "n1", [0, 1, 2, 3])
    log.start("old", "n1")
    log.run_to_queue("urgent", gpus=2, priority=1000, priority_class="urgent", after=3600)
    return log


def play(log: LogBuilder, cycles: int) -> list[str]:
    """Placement cycles, each victim stopping at once and each placed job starting:
    what each cycle decided, as "preempt old" and "place urgent"."""
    said = []
    for _ in range(cycles):
        decisions = placement_cycle(log.state(), BestFit())
        log.record_decisions(decisions)
        for decision in decisions:
            event = decision.event
            if isinstance(event, JobPreempted):
                said.append(f"preempt {event.job_id}")
                log.finish(event.job_id, "n1", "preempted", attempt=event.attempt, exit_code=143)
            elif isinstance(event, JobPlaced):
                said.append(f"place {event.job_id}")
                log.start(event.job_id, "n1", attempt=event.attempt)
    return said


def test_the_victim_waits_behind_its_preemptor_which_takes_what_was_freed() -> None:
    log = urgent_job_for_a_full_node(victims_yield=True)
    assert play(log, 4) == ["preempt old", "place urgent"]
    state = log.state()
    assert state.jobs["urgent"].phase == "running" and state.jobs["old"].phase == "queued"
    assert state.jobs["old"].yields_to == "urgent"


def test_a_log_written_before_the_rule_keeps_its_thrash_so_its_audit_holds() -> None:
    log = urgent_job_for_a_full_node(victims_yield=False)
    said = play(log, 4)
    assert said == ["preempt old", "place old"] * 2
    assert log.state().jobs["urgent"].phase == "queued"


def test_the_victim_ranks_first_again_once_placed_or_its_preemptor_gone() -> None:
    log = urgent_job_for_a_full_node(victims_yield=True)
    play(log, 1)  # old preempted and requeued: it yields
    assert [j.job_id for j in queue_order(log.state())] == ["urgent", "old"]
    log.request_cancel("urgent")
    log.cancel("urgent")
    assert [j.job_id for j in queue_order(log.state())] == ["old"]
    log.place("old", "n1", [0, 1, 2, 3], attempt=2)
    assert log.state().jobs["old"].yields_to is None


@pytest.mark.parametrize("plain", [True, False], ids=["plain priority", "multifactor"])
def test_victims_move_right_behind_their_preemptor_and_the_rest_keep_their_ranks(
    plain: bool,
) -> None:
    """Victims `v1` and `v2` (yielding to `p`) rank before `a` and `p`; `b` after: the
    order is a, p, v1, v2, b. `x` and `y` yield to each other (quota reclaims both
    ways): they keep their ranks rather than leave the queue."""
    log = LogBuilder()
    weights = {} if plain else {"weight_age": 10, "max_age_s": 1e9}
    log.append(QueuePolicySet(victims_yield=True, **weights))
    log.register("n1", 4)
    for job_id, priority in [("v1", 9), ("v2", 8), ("x", 7), ("y", 6), ("a", 5), ("p", 4)]:
        log.run_to_queue(job_id, priority=priority)
    log.run_to_queue("b", priority=3)
    state = log.state()
    for victim, preemptor in [("v1", "p"), ("v2", "p"), ("x", "y"), ("y", "x")]:
        state.jobs[victim].yields_to = preemptor  # by hand, with the fold's index of them
        state.queued_yielding.add(victim)
    assert [j.job_id for j in queue_order(state)] == ["x", "y", "a", "p", "v1", "v2", "b"]


async def test_the_queue_listing_shows_the_victim_behind_its_preemptor_and_why() -> None:
    log = urgent_job_for_a_full_node(victims_yield=True)
    play(log, 1)
    log.run_to_queue("later", gpus=1)
    folded: Any = SimpleNamespace(state=log.state())
    reads = Reads(Gateway(Settings(), sessions=None, read_model=folded))  # type: ignore[arg-type]
    listed = await queue(reads, Principal("ops", frozenset({OPERATOR})), limit=10)
    assert [(j.id, j.reason) for j in listed.jobs] == [
        ("urgent", None),
        ("old", "Yields to urgent: preempted for it, it goes first"),
        ("later", None),
    ]


def test_the_queue_service_writes_the_rule_into_its_policy() -> None:
    assert configured_policy(Settings()).victims_yield


@pytest.mark.parametrize("brief", [False, True], ids=["gpuloom explain", "GET /v1/jobs/{id}"])
def test_explain_says_the_victim_yields_to_its_preemptor(brief: bool) -> None:
    log = urgent_job_for_a_full_node(victims_yield=True)
    play(log, 1)
    found = explain(log.state(), "old", brief=brief)
    assert found is not None and found.detail is not None
    assert found.detail.endswith(
        "it yields to urgent, which it was preempted for and which goes first"
    )
    if not brief:
        assert found.ahead == ["urgent"]
    log.request_cancel("urgent")
    log.cancel("urgent")
    again = explain(log.state(), "old", brief=brief)
    assert again is not None and "yields" not in (again.detail or "")

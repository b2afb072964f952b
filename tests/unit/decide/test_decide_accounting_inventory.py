"""Accounting charges ended runs once; inventory registers, loses and recovers nodes."""

from __future__ import annotations

from datetime import timedelta

import pytest
from fixtures.checks import check_invariants

from gpuloom.decide.accounting import decide_charges
from gpuloom.decide.inventory import Heard, decide_inventory
from gpuloom.events import NodeLost, NodeRecovered, NodeRegistered, NodeSpec, UsageCharged
from gpuloom.testing.builders import T0, LogBuilder, make_gpus, make_node_spec

# --- accounting -----------------------------------------------------------------------


def test_an_ended_run_is_charged_gpus_times_1000_times_seconds() -> None:
    log = LogBuilder()
    log.register("n1")
    log.run_to_queue("j1", gpus=3, user="bob", account="vision")
    log.place("j1", "n1", [0, 1, 2])
    log.start("j1", "n1")
    log.finish("j1", "n1", after=90.5)
    state = log.state()
    [decision] = decide_charges(state)
    assert decision.event == UsageCharged(
        job_id="j1",
        attempt=1,
        user="bob",
        account="vision",
        gpus=3,
        seconds=90.5,
        gpu_milli_seconds=271_500,
        by_model={"A100-80GB": 271_500},
    )
    assert decision.msg_id == "j1:charged:1"
    assert decision.causation_id == state.jobs["j1"].last_event_id
    log.record_decisions([decision])
    state = log.state()
    assert state.voided == 0
    assert state.usage_by_account == {"vision": 271_500}
    assert decide_charges(state) == [], "each run is charged once"


def test_every_run_of_a_requeued_job_is_charged_and_running_ones_wait() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.register("n2", 2)
    log.run_to_queue("j1", gpus=2)
    log.place("j1", "n1", [0, 1])
    log.start("j1", "n1")
    log.lose("n1", after=10)
    log.place("j1", "n2", [0, 1], attempt=2)
    log.start("j1", "n2", attempt=2)
    assert [d.event.attempt for d in decide_charges(log.state())] == [1]  # type: ignore[attr-defined]
    log.finish("j1", "n2", attempt=2, after=20)
    decisions = decide_charges(log.state())
    assert [(d.event.attempt, d.event.gpu_milli_seconds) for d in decisions] == [  # type: ignore[attr-defined]
        (1, 20_000),
        (2, 40_000),
    ]
    assert [d.msg_id for d in decisions] == ["j1:charged:1", "j1:charged:2"]
    log.record_decisions(decisions)
    state = log.state()
    assert state.voided == 0 and state.uncharged == set()
    assert state.usage_by_user == {"alice": 60_000}
    check_invariants(state, len(log))


def test_charges_follow_submission_order_and_skip_jobs_that_never_ran() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    for job_id in ("b", "a", "never"):
        log.run_to_queue(job_id, gpus=1)
    log.place("a", "n1", [0])
    log.place("b", "n1", [1])
    log.place("never", "n1", [2])
    log.start("a", "n1")
    log.start("b", "n1")
    log.finish("a", "n1")
    log.finish("b", "n1")
    log.finish("never", "n1", "cancelled")
    assert [d.event.job_id for d in decide_charges(log.state())] == ["b", "a"]  # type: ignore[attr-defined]


def test_a_running_job_is_charged_periodically_and_its_parts_add_up_to_the_run() -> None:
    log = LogBuilder()
    log.register("n1")
    log.run_to_queue("j1", gpus=2, account="vision")
    log.place("j1", "n1", [0, 1])
    started = log.start("j1", "n1").envelope.at
    interval = timedelta(seconds=60)
    assert decide_charges(log.state(), started + timedelta(seconds=30), interval) == []
    first_end = started + timedelta(seconds=61.5)
    [first] = decide_charges(log.state(), first_end, interval)
    event = first.event
    assert isinstance(event, UsageCharged)
    milli = log.state().jobs["j1"].runs[0].gpu_milli
    assert (event.part, event.period_end, event.seconds) == (0, first_end, 61.5)
    assert event.gpu_milli_seconds == round(milli * 61.5)
    assert first.msg_id == "j1:charged-interim:1"
    log.record_decisions([first])
    second_end = first_end + timedelta(seconds=60)
    [second] = decide_charges(log.state(), second_end, interval)
    assert second.event.part == 1 and second.msg_id == "j1:charged-interim:1:p1"  # type: ignore[attr-defined]
    log.record_decisions([second])
    log.finish("j1", "n1", after=200.25)
    state = log.state()
    run = state.jobs["j1"].runs[0]
    [final] = decide_charges(state, run.ended_at, interval)
    assert final.event.part == 2 and final.event.period_end is None  # type: ignore[attr-defined]
    assert final.msg_id == "j1:charged:1:p2"
    log.record_decisions([final])
    state = log.state()
    assert state.voided == 0
    charges = [r.event for r in log.records if isinstance(r.event, UsageCharged)]
    assert sum(c.gpu_milli_seconds for c in charges) == run.gpu_milli_seconds()
    assert state.usage_by_account["vision"] == run.gpu_milli_seconds()
    assert decide_charges(state, run.ended_at + interval * 3, interval) == []


def test_an_interim_charge_must_be_the_next_part_and_move_forward() -> None:
    log = LogBuilder()
    log.register("n1")
    log.run_to_queue("j1", gpus=1)
    log.place("j1", "n1", [0])
    started = log.start("j1", "n1").envelope.at
    [charge] = decide_charges(log.state(), started + timedelta(seconds=90), timedelta(seconds=60))
    log.record_decisions([charge])
    log.record_decisions([charge])  # a repeat: same part again
    assert log.state().voided == 1
    event = charge.event
    assert isinstance(event, UsageCharged)
    backwards = event.model_copy(update={"part": 1})
    log.append(backwards)
    assert log.state().voided == 2, "an interim charge that does not pass the last one"


# --- inventory ------------------------------------------------------------------------

NOW = T0 + timedelta(hours=1)
TIMEOUT = timedelta(seconds=10)
LONG_AGO = NOW - timedelta(hours=1)


def heard(seconds_ago: float, spec_gpus: int = 4, name: str = "n1") -> Heard:
    return Heard(at=NOW - timedelta(seconds=seconds_ago), spec=make_node_spec(name, spec_gpus))


def test_a_new_node_that_heartbeats_is_registered() -> None:
    decisions = decide_inventory(LogBuilder().state(), {"n1": heard(1)}, NOW, TIMEOUT, LONG_AGO)
    assert [d.event for d in decisions] == [NodeRegistered(node="n1", spec=make_node_spec("n1"))]
    assert decisions[0].msg_id == "n1:registered:0"


def test_a_node_whose_spec_changed_is_registered_again() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    decisions = decide_inventory(log.state(), {"n1": heard(1, 8)}, NOW, TIMEOUT, LONG_AGO)
    assert [d.event for d in decisions] == [NodeRegistered(node="n1", spec=make_node_spec("n1", 8))]
    assert decisions[0].msg_id == "n1:registered:1"


def test_a_ready_node_that_heartbeats_the_same_spec_needs_nothing() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    assert decide_inventory(log.state(), {"n1": heard(9)}, NOW, TIMEOUT, LONG_AGO) == []


def test_an_unknown_node_heard_too_long_ago_is_not_registered() -> None:
    assert decide_inventory(LogBuilder().state(), {"n1": heard(11)}, NOW, TIMEOUT, LONG_AGO) == []


@pytest.mark.parametrize(
    ("beats", "watching_since", "lost"),
    [
        ({}, LONG_AGO, True),
        ({}, NOW - timedelta(seconds=5), False),
        ({"n1": heard(30)}, LONG_AGO, True),
        ({"n1": heard(30)}, NOW - timedelta(seconds=5), False),
        ({"n1": heard(5)}, LONG_AGO, False),
    ],
    ids=[
        "a node never heard since watching began long ago is lost",
        "a node not heard yet is given the timeout after watching began",
        "a node silent longer than the timeout is lost",
        "a silent node is not lost right after watching began",
        "a node heard within the timeout is kept",
    ],
)
def test_a_silent_ready_node_is_lost(
    beats: dict[str, Heard], watching_since: object, lost: bool
) -> None:
    log = LogBuilder()
    log.register("n1", 4)
    decisions = decide_inventory(log.state(), beats, NOW, TIMEOUT, watching_since)  # type: ignore[arg-type]
    assert [type(d.event) for d in decisions] == ([NodeLost] if lost else [])


def test_the_lost_reason_says_how_long_the_node_was_silent() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    [decision] = decide_inventory(log.state(), {"n1": heard(30)}, NOW, TIMEOUT, LONG_AGO)
    assert decision.event == NodeLost(node="n1", reason="no heartbeat for 30.0s")
    assert decision.msg_id == "n1:lost:1"


def test_a_lost_node_that_heartbeats_recovers_and_a_silent_one_stays_lost() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.register("n2", 4)
    log.lose("n1")
    log.lose("n2")
    beats = {"n1": heard(1), "n2": heard(60, name="n2")}
    decisions = decide_inventory(log.state(), beats, NOW, TIMEOUT, LONG_AGO)
    assert [d.event for d in decisions] == [NodeRecovered(node="n1")]
    assert decisions[0].msg_id == "n1:recovered:4"


def test_inventory_decisions_apply_cleanly_in_node_order() -> None:
    log = LogBuilder()
    log.register("b", 4)
    log.register("c", 4)
    log.lose("c")
    beats = {"c": heard(1, name="c"), "a": heard(1, name="a")}
    decisions = decide_inventory(log.state(), beats, NOW, TIMEOUT, LONG_AGO)
    assert [(type(d.event).__name__, d.event.aggregate_id()) for d in decisions] == [
        ("NodeRegistered", "a"),
        ("NodeRecovered", "c"),
        ("NodeLost", "b"),
    ]
    log.record_decisions(decisions)
    state = log.state()
    assert state.voided == 0
    assert {n: node.phase for n, node in state.nodes.items()} == {
        "a": "ready",
        "b": "lost",
        "c": "ready",
    }


@pytest.mark.parametrize(
    "spec",
    [
        make_node_spec("n1", 3),
        make_node_spec("n1", gpu_list=make_gpus("n1", 4) + make_gpus("n1", 1)),
    ],
    ids=[
        "a heartbeat without an allocated GPU is not proposed again and again",
        "a heartbeat with a GPU index twice is not proposed again and again",
    ],
)
def test_inventory_only_proposes_registrations_the_fold_accepts(spec: NodeSpec) -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.run_to_queue("j1", gpus=1)
    log.place("j1", "n1", [3])
    log.start("j1", "n1")
    beats = {"n1": Heard(at=NOW, spec=spec)}
    for _ in range(3):  # three rounds of the inventory reactor: decide, publish, fold
        log.record_decisions(decide_inventory(log.state(), beats, NOW, TIMEOUT, LONG_AGO))
    state = log.state()
    assert state.voided == 0, state.recent_voided

"""Priority classes: folded (one default at most), checked by admission, and obeyed by
preemption (a class that may not preempt never does; a job without a class keeps
today's behaviour)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuloom.decide.admission import decide_admission
from gpuloom.events import (
    JobAdmitted,
    JobPreempted,
    JobRejected,
    JobSubmitted,
    PriorityClassDeleted,
    PriorityClassSet,
    decode,
    encode,
    make_envelope,
)
from gpuloom.placement.candidate import Candidate
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.engine import Context, NodeIndex, place
from gpuloom.placement.holdings import Holding, scratch
from gpuloom.placement.outcomes import Preempted
from gpuloom.placement.policies import BestFit
from gpuloom.placement.resources import GpuView, NodeView, Request
from gpuloom.placement.scheduling import PassInputs, schedule
from gpuloom.queueing.classes import class_named, classes, default_class, may_preempt
from gpuloom.testing.builders import T0, LogBuilder, make_job_spec


def test_setting_a_default_class_takes_the_default_from_the_previous_one() -> None:
    log = LogBuilder()
    log.append(PriorityClassSet(name="batch", priority=10, default=True))
    log.append(PriorityClassSet(name="urgent", priority=1000, default=True))
    state = log.state()
    assert [c.name for c in state.priority_classes.values() if c.default] == ["urgent"]
    assert default_class(state).name == "urgent"
    assert state.priority_classes["batch"].priority == 10, "only the flag changed"


def test_without_a_default_class_the_built_in_normal_is_the_default_and_always_listed() -> None:
    log = LogBuilder()
    assert default_class(log.state()).name == "normal"
    log.append(PriorityClassSet(name="batch", priority=10))
    state = log.state()
    assert default_class(state).name == "normal"
    assert [c.name for c in classes(state)] == ["batch", "normal"]
    normal = class_named(state, "normal")
    assert normal is not None and (normal.priority, normal.may_preempt) == (0, True)


def test_an_operators_normal_class_replaces_the_built_in_one() -> None:
    log = LogBuilder()
    log.append(PriorityClassSet(name="normal", priority=5, may_preempt=False))
    normal = default_class(log.state())
    assert (normal.name, normal.priority, normal.may_preempt) == ("normal", 5, False)


def test_deleting_a_class_removes_it_and_deleting_an_unknown_one_is_voided() -> None:
    log = LogBuilder()
    log.append(PriorityClassSet(name="urgent", priority=1000, default=True))
    log.append(PriorityClassDeleted(name="urgent"))
    log.append(PriorityClassDeleted(name="urgent"))
    state = log.state()
    assert state.priority_classes == {}
    assert default_class(state).name == "normal", "the default is gone with its class"
    assert [v.reason for v in state.recent_voided] == ["priority class urgent does not exist"]


NAMES = st.sampled_from(["a", "b", "c"])
SETS = st.lists(st.tuples(NAMES, st.booleans(), st.integers(-5, 5)), max_size=12)


@given(SETS)
def test_at_most_one_class_is_the_default_and_it_is_the_latest_so_set(
    sets: list[tuple[str, bool, int]],
) -> None:
    log = LogBuilder()
    expected = None
    for name, default, priority in sets:
        log.append(PriorityClassSet(name=name, priority=priority, default=default))
        if default:
            expected = name
        elif name == expected:
            expected = None
    state = log.state()
    assert sum(c.default for c in state.priority_classes.values()) <= 1
    assert default_class(state).name == (expected or "normal")


def test_the_members_of_a_class_are_kept_sorted_whatever_their_order() -> None:
    one = PriorityClassSet(name="x", priority=1, users=["bob", "alice", "bob"])
    other = PriorityClassSet(name="x", priority=1, users=["alice", "bob"])
    assert one == other


# --- admission --------------------------------------------------------------------------


def admitted_or_reason(log: LogBuilder, job_id: str) -> str | None:
    [decision] = [d for d in decide_admission(log.state()) if d.event.job_id == job_id]
    if isinstance(decision.event, JobAdmitted):
        return None
    assert isinstance(decision.event, JobRejected)
    return decision.event.reason


@pytest.mark.parametrize(
    ("priority_class", "user", "account", "reason"),
    [
        (None, "alice", "research", None),
        ("normal", "alice", "research", None),
        ("gold", "alice", "research", "priority class gold does not exist"),
        ("vip", "alice", "research", None),
        ("vip", "carol", "ops", None),
        (
            "vip",
            "bob",
            "research",
            "user bob may not use priority class vip (under account research)",
        ),
    ],
    ids=[
        "a job from before classes is admitted as before",
        "the built-in normal class needs no definition",
        "an unknown class is rejected",
        "a listed user may use the class",
        "a job under a listed account may use the class",
        "anyone else is rejected naming the class",
    ],
)
def test_admission_checks_the_class_exists_and_may_be_used(
    priority_class: str | None, user: str, account: str, reason: str | None
) -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.append(PriorityClassSet(name="vip", priority=100, users=["alice"], accounts=["ops"]))
    log.submit("j1", priority_class=priority_class, user=user, account=account)
    assert admitted_or_reason(log, "j1") == reason


# --- preemption -------------------------------------------------------------------------


def full_cluster_with_a_preemptible_job() -> LogBuilder:
    """n1 (4 GPUs) wholly held by a preemptible job of priority 0."""
    log = LogBuilder()
    log.register("n1", 4)
    log.run_to_queue("low", gpus=4, preemptible=True)
    log.place("low", "n1", [0, 1, 2, 3])
    log.start("low", "n1")
    return log


def preempted_by_a_cycle(log: LogBuilder) -> list[str]:
    return [
        d.event.job_id
        for d in placement_cycle(log.state(), BestFit())
        if isinstance(d.event, JobPreempted)
    ]


@pytest.mark.parametrize(
    ("may", "expected"),
    [(True, ["low"]), (False, [])],
    ids=["a class that may preempt stops the lower job", "a class that may not never does"],
)
def test_a_job_preempts_only_if_its_class_may(may: bool, expected: list[str]) -> None:
    log = full_cluster_with_a_preemptible_job()
    log.append(PriorityClassSet(name="high", priority=100, may_preempt=may))
    log.run_to_queue("high", gpus=2, priority=100, priority_class="high")
    assert preempted_by_a_cycle(log) == expected


def test_a_job_without_a_class_preempts_as_it_always_did() -> None:
    log = full_cluster_with_a_preemptible_job()
    log.run_to_queue("old", gpus=2, priority=100)
    assert preempted_by_a_cycle(log) == ["low"]


def test_a_job_whose_class_was_deleted_may_no_longer_preempt() -> None:
    log = full_cluster_with_a_preemptible_job()
    log.append(PriorityClassSet(name="high", priority=100))
    log.run_to_queue("high", gpus=2, priority=100, priority_class="high")
    log.append(PriorityClassDeleted(name="high"))
    state = log.state()
    assert not may_preempt(state, state.jobs["high"].spec)
    assert preempted_by_a_cycle(log) == []


def test_a_blocked_job_that_may_not_preempt_uses_up_the_passes_turn_to_preempt() -> None:
    """Only the first blocked job may preempt: one behind it must not jump it by
    preempting in its place."""
    log = full_cluster_with_a_preemptible_job()
    log.append(PriorityClassSet(name="polite", priority=50, may_preempt=False))
    log.run_to_queue("polite", gpus=2, priority=50, priority_class="polite")
    log.run_to_queue("rude", gpus=2, priority=40)
    assert preempted_by_a_cycle(log) == []


def test_the_scheduler_never_preempts_for_a_candidate_that_may_not() -> None:
    index = NodeIndex(
        [NodeView("n0", 0, [GpuView(i, f"u{i}", "A100", "physical", 80) for i in range(4)])]
    )
    placement = place(Request(gpus=4), index, BestFit(), Context())
    assert placement is not None
    held = [Holding("low", placement.replicas, None, priority_class=0, preemptible=True)]
    for may, expected in ((False, 0), (True, 1)):
        high = Candidate("high", Request(gpus=2), None, priority_class=50, may_preempt=may)
        outcomes = schedule(PassInputs([high], scratch(index), Context(), 0, held), BestFit())
        assert sum(isinstance(o, Preempted) for o in outcomes) == expected


def test_a_submission_written_before_classes_reads_as_one_without_a_class() -> None:
    """No upcaster: `priority_class` is a new optional field, and None means what a
    spec meant before (its priority stands, it may preempt)."""
    event = JobSubmitted(job_id="old", spec=make_job_spec(priority=7))
    envelope = make_envelope(event, at=T0, by="gateway")
    data = {**envelope.data, "spec": {**envelope.data["spec"]}}
    del data["spec"]["priority_class"]
    recorded = decode(1, encode(envelope.model_copy(update={"data": data})))
    assert isinstance(recorded.event, JobSubmitted)
    assert (recorded.event.spec.priority_class, recorded.event.spec.priority) == (None, 7)

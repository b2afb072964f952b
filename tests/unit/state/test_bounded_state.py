"""The state is bounded by the live cluster: jobs that ended and were charged leave it
(`gpuloom.state.retention`), and no decision changes for it.

The property folds random logs twice, forgetting and keeping every job
(`fold(..., keep_history=True)`, the semantics before retention), and asks every
pure decision (admission, queue, placement with best fit and with FGD's typical
workload, accounting) at every position: the answers must be the same, and so must
what the fold applied and voided.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

import pytest
from fixtures.actions import ACTIONS, MODELS
from fixtures.checks import apply_expecting_void, check_invariants
from fixtures.world import World
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuloom.decide.accounting import decide_charges
from gpuloom.decide.admission import decide_admission
from gpuloom.decide.explain import explain
from gpuloom.decide.queueing import decide_queue
from gpuloom.events import (
    Dependency,
    JobAdmitted,
    JobArraySubmitted,
    JobCancelRequested,
    JobFinished,
    JobPreempted,
    JobRejected,
    JobStarted,
    JobSubmitted,
    QueuePolicySet,
    Recorded,
    UsageCharged,
)
from gpuloom.placement import BestFit, placement_cycle
from gpuloom.placement.registry import default_registry
from gpuloom.queueing.order import pending_in_order
from gpuloom.state import ClusterState, JobState, apply, fold
from gpuloom.state.model import RECENT_SPECS_KEPT
from gpuloom.state.retention import RETENTION, final_phase
from gpuloom.testing.builders import TEST_POLICY, LogBuilder, make_job_spec

FGD = default_registry().get("fgd")


# --- a world with dependencies, arrays and accounts ------------------------------------


@dataclass(frozen=True)
class SubmitAfter:
    """A job that depends on a known job (live or ended), or on one never submitted."""

    pick: int
    when: Literal["succeeded", "finished"]
    account: str
    key: str | None


@dataclass(frozen=True)
class SubmitArray:
    tasks: int
    key: str | None


EXTRA = st.one_of(
    st.builds(
        SubmitAfter,
        st.integers(0, 63),
        st.sampled_from(["succeeded", "finished"]),
        st.sampled_from(["research", "vision"]),
        st.sampled_from([None, None, "k1", "k3"]),
    ),
    st.builds(SubmitArray, st.integers(1, 3), st.sampled_from([None, "k2", "k4"])),
)


class DependencyWorld(World):
    def play(self, action: object) -> None:
        match action:
            case SubmitAfter():
                known = sorted([*self.state.jobs, *self.state.tombstones])
                pool = [*known, "ghost"]
                target = pool[action.pick % len(pool)]
                spec = make_job_spec(
                    1, account=action.account, depends_on=[Dependency(job=target, when=action.when)]
                )
                job_id = f"d{len(self.log)}"
                self.record(JobSubmitted(job_id=job_id, spec=spec, idempotency_key=action.key))
            case SubmitArray():
                spec = make_job_spec(1, account="vision", array=action.tasks)
                array = JobArraySubmitted(
                    job_id=f"a{len(self.log)}", spec=spec, idempotency_key=action.key
                )
                self.record(array)
            case _:
                super().play(action)


def decisions(state: ClusterState) -> list[Any]:
    """Every pure decision the services would make on `state` (the placement ones twice:
    best fit, and FGD, whose typical workload reads the latest submissions)."""
    pending = sorted(state.submitted | state.admitted | state.queued)
    return [
        decide_admission(state),
        decide_queue(state),
        placement_cycle(state, BestFit()),
        placement_cycle(state, FGD),
        decide_charges(state),
        [explain(state, job_id, brief=True) for job_id in pending],
    ]


def compare_at_every_position(records: list[Recorded]) -> ClusterState:
    """Fold `records` forgetting and keeping history; assert the same decisions after
    every event; return the forgetting state."""
    forgetting, keeping = ClusterState(), ClusterState()
    for record in records:
        apply(forgetting, record)
        apply(keeping, record, keep_history=True)
        position = f"after seq {record.seq} ({record.envelope.type})"
        assert (forgetting.applied, forgetting.voided) == (keeping.applied, keeping.voided), (
            f"{position}: {forgetting.recent_voided[-1:]} / {keeping.recent_voided[-1:]}"
        )
        assert decisions(forgetting) == decisions(keeping), position
        check_live_part(forgetting, keeping)
    return forgetting


def check_live_part(forgetting: ClusterState, keeping: ClusterState) -> None:
    """The live jobs are the same; a forgotten one ended, was charged, left a tombstone."""
    for job_id, job in forgetting.jobs.items():
        assert keeping.jobs[job_id] == job
    for job_id, job in keeping.jobs.items():
        if job_id not in forgetting.jobs:
            assert job.is_final and job_id not in keeping.uncharged
            assert forgetting.tombstones[job_id].phase == job.phase
    for name in ("queued", "submitted", "admitted", "uncharged", "cancel_pending", "arrays"):
        assert getattr(forgetting, name) == getattr(keeping, name), name
    latest = sorted(keeping.jobs.values(), key=lambda j: j.order)[-RECENT_SPECS_KEPT:]
    assert keeping.recent_specs[-RECENT_SPECS_KEPT:] == [j.spec for j in latest]
    assert forgetting.recent_specs == keeping.recent_specs


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    models=st.lists(st.sampled_from(MODELS), min_size=2, max_size=3),
    gpus=st.integers(1, 4),
    fair_share=st.booleans(),
    actions=st.lists(st.one_of(ACTIONS, ACTIONS, EXTRA), min_size=25, max_size=60),
)
def test_forgetting_ended_jobs_changes_no_decision(
    models: list[str], gpus: int, fair_share: bool, actions: list[object]
) -> None:
    world = DependencyWorld(models, gpus)
    if fair_share:  # the multifactor order reads every account a job ever named
        world.record(QueuePolicySet(weight_fair_share=1000, weight_age=10))
    for action in actions:
        world.play(action)
    world.check_replay()
    state = compare_at_every_position(world.log.records)
    assert state == world.state


# --- the property can fail ----------------------------------------------------------------


def finished_not_charged() -> LogBuilder:
    log = LogBuilder()
    log.register("n1", 2)
    log.run_to_queue("j1", gpus=1)
    log.place("j1", "n1", [0])
    log.start("j1", "n1")
    log.finish("j1", "n1", after=60)
    return log


def test_the_comparison_catches_a_job_forgotten_before_it_is_charged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Forgetting an uncharged job would lose its charge: the property sees it."""

    def careless(state: ClusterState, job: JobState, step: Any) -> None:
        if job.is_final and not step.keep_history:
            state.uncharged.discard(job.job_id)
            del state.jobs[job.job_id]

    monkeypatch.setattr(sys.modules["gpuloom.state.retention"], "retire_if_done", careless)
    log = finished_not_charged()
    with pytest.raises(AssertionError):
        compare_at_every_position(log.records)


def test_an_uncharged_job_stays_until_its_charge() -> None:
    log = finished_not_charged()
    state = log.state()
    assert state.jobs["j1"].phase == "succeeded" and state.uncharged == {"j1"}
    [charge] = decide_charges(state)
    apply(state, log.append(charge.event))
    assert "j1" not in state.jobs and state.tombstones["j1"].phase == "succeeded"
    assert state.usage_by_account == {"research": 60_000}


# --- late events about a forgotten job ----------------------------------------------------


def forgotten_job() -> LogBuilder:
    log = finished_not_charged()
    log.charge("j1", seconds=60)
    log.run_to_queue("other", gpus=1)
    return log


LATE_EVENTS: list[tuple[str, Any]] = [
    ("a second JobFinished", JobFinished(job_id="j1", attempt=1, node="n1", outcome="failed")),
    ("a JobStarted of its attempt", JobStarted(job_id="j1", attempt=1, node="n1")),
    ("a JobStarted of another attempt", JobStarted(job_id="j1", attempt=2, node="n1")),
    ("a cancel request", JobCancelRequested(job_id="j1")),
    ("a JobRejected", JobRejected(job_id="j1", reason="late")),
    (
        "a second UsageCharged",
        UsageCharged(
            job_id="j1",
            attempt=1,
            user="alice",
            account="research",
            gpus=1,
            seconds=60,
            gpu_milli_seconds=60_000,
        ),
    ),
    ("a resubmission of its id", JobSubmitted(job_id="j1", spec=make_job_spec(1))),
]


@pytest.mark.parametrize("event", [e for _, e in LATE_EVENTS], ids=[s for s, _ in LATE_EVENTS])
def test_a_late_event_about_a_forgotten_job_is_voided_and_changes_nothing(event: Any) -> None:
    log = forgotten_job()
    state = log.state()
    assert "j1" in state.tombstones
    recorded = log.append(event)
    why = "already submitted" if isinstance(event, JobSubmitted) else "already succeeded"
    apply_expecting_void(state, recorded, f"job j1 {why}")
    check_invariants(state, len(log))
    kept = fold(log.records, keep_history=True)
    assert kept.recent_voided[-1].seq == recorded.seq, "voided with history kept too"


# --- bounded size, and what happens after the window --------------------------------------

STEP = timedelta(minutes=10)


def long_history(jobs: int, live: int) -> LogBuilder:
    """`jobs` jobs that ran, ended and were charged, one every 10 minutes (with an
    idempotency key each, and an array of 3 every 50), then `live` jobs queued."""
    log = LogBuilder()
    log.register("n1", 8)
    for number in range(jobs):
        job_id = f"old{number}"
        log.run_to_queue(job_id, gpus=1, idempotency_key=f"key-{number}", after=STEP.seconds)
        log.place(job_id, "n1", [0])
        log.start(job_id, "n1")
        log.finish(job_id, "n1", after=60)
        log.charge(job_id, seconds=60)
        if number % 50 == 0:
            array_id = f"arr{number}"
            spec = make_job_spec(0, array=3)
            log.append(JobArraySubmitted(job_id=array_id, spec=spec, idempotency_key=array_id))
            for task in range(3):
                log.reject(f"{array_id}-{task}", "test")
    for number in range(live):
        log.run_to_queue(f"live{number}", gpus=1)
    return log


def test_the_state_holds_the_live_jobs_and_a_window_of_tombstones() -> None:
    jobs, live = 3000, 5
    log = long_history(jobs, live)
    state = log.state()
    assert sorted(state.jobs) == [f"live{n}" for n in range(live)]
    # A job every 10 minutes or so: a week of them is kept (under 1008), nothing older.
    assert state.clock is not None
    charged = {
        r.event.job_id: r.envelope.at for r in log.records if isinstance(r.event, UsageCharged)
    }
    recent = {job_id for job_id, at in charged.items() if state.clock - at <= RETENTION}
    assert {j for j in state.tombstones if j.startswith("old")} == recent
    window = RETENTION // STEP
    assert window // 2 < len(recent) <= window
    assert "old0" not in state.tombstones and f"old{jobs - 1}" in state.tombstones
    assert len(state.idempotency_keys) <= window + window // 50 + 2
    assert len(state.arrays) <= window // 50 + 2 and "arr0" not in state.arrays
    assert len(state.retired) <= 2 * len(state.tombstones) + 1024, "the expired ones are dropped"
    assert len(state.recent_specs) < 2 * RECENT_SPECS_KEPT
    assert state.forgotten_by_phase == {"succeeded": jobs, "rejected": 3 * (1 + (jobs - 1) // 50)}
    assert state.usage_by_account == {"research": 60_000 * jobs}
    check_invariants(state, len(log))
    # The same with the log cut anywhere: the fold of a prefix continued is the fold.
    cut = len(log) // 2
    assert fold(log.records[cut:], log.state(cut)) == state


def test_within_the_window_a_dependency_on_a_forgotten_job_answers_as_before() -> None:
    log = forgotten_job()
    log.submit("next", make_job_spec(1, depends_on=[Dependency(job="j1")]))
    log.submit("not-yet", make_job_spec(1, depends_on=[Dependency(job="other")]))
    state = log.state()
    assert "j1" in state.tombstones
    answers = decide_admission(state)
    assert [d.event for d in answers] == [JobAdmitted(job_id="next"), JobAdmitted(job_id="not-yet")]
    assert answers == decide_admission(log.state(keep_history=True))


def test_after_the_window_the_forgotten_job_is_unknown_with_a_clear_reason() -> None:
    log = forgotten_job()
    late = (RETENTION + timedelta(seconds=1)).total_seconds()
    log.submit("next", make_job_spec(1, depends_on=[Dependency(job="j1")]), after=late)
    state = log.state()
    assert "j1" not in state.tombstones and final_phase(state, "j1") is None
    [answer] = decide_admission(state)
    assert isinstance(answer.event, JobRejected) and answer.event.job_id == "next"
    assert answer.event.reason == (
        "depends on unknown job j1 (never submitted, or ended more than 7 days ago and "
        "no longer tracked)"
    )


def test_an_idempotency_key_lives_as_long_as_its_job_is_remembered() -> None:
    log = LogBuilder()
    log.submit("j1", idempotency_key="once")
    log.reject("j1", "no")
    state = log.state()
    assert state.idempotency_keys == {"once": "j1"}
    apply_expecting_void(
        state,
        log.append(JobSubmitted(job_id="j2", spec=make_job_spec(1), idempotency_key="once")),
        "idempotency key already used by job j1",
    )
    late = (RETENTION + timedelta(seconds=1)).total_seconds()
    apply(state, log.append(JobSubmitted(job_id="j3", spec=make_job_spec(1)), after=late))
    assert state.idempotency_keys == {} and state.tombstones == {}
    apply(
        state, log.append(JobSubmitted(job_id="j4", spec=make_job_spec(1), idempotency_key="once"))
    )
    assert state.idempotency_keys == {"once": "j4"}


def test_fair_share_still_counts_the_accounts_of_forgotten_jobs() -> None:
    """Shares are normalised over every account a job named: an account whose jobs
    all left the state still counts, or the others' factors (and the order) would move."""
    log = LogBuilder()
    log.register("n1", 2)
    log.append(QueuePolicySet(weight_fair_share=1000, weight_age=1))
    for job_id, account, seconds in (("a1", "a", 3600), ("b1", "b", 10)):
        log.run_to_queue(job_id, gpus=1, account=account)
        log.place(job_id, "n1", [0])
        log.start(job_id, "n1")
        log.finish(job_id, "n1", after=seconds)
        log.charge(job_id, account=account, seconds=seconds)
    log.run_to_queue("b2", gpus=2, account="b")
    log.run_to_queue("c2", gpus=2, account="c")
    forgetting, keeping = log.state(), log.state(keep_history=True)
    assert not {"a1", "b1"} & set(forgetting.jobs)
    ranked = [(job.job_id, factors) for job, factors in pending_in_order(keeping)]
    assert [(job.job_id, factors) for job, factors in pending_in_order(forgetting)] == ranked
    assert decisions(forgetting) == decisions(keeping)


def test_a_preemption_for_a_job_that_already_left_is_applied_as_before() -> None:
    """Placement preempts for a queued job that is cancelled (and forgotten) before the
    JobPreempted is folded: the victim is told to stop, as when every job was kept."""
    log = LogBuilder()
    log.register("n1", 1)
    log.run_to_queue("victim", gpus=1)
    log.place("victim", "n1", [0])
    log.start("victim", "n1")
    log.run_to_queue("urgent", gpus=1)
    log.request_cancel("urgent")
    log.cancel("urgent")
    preempted = JobPreempted(
        job_id="victim",
        attempt=1,
        by="urgent",
        reason="priority",
        basis_seq=1,
        cycle_position=0,
        policy=TEST_POLICY,
    )
    log.append(preempted)
    state = compare_at_every_position(log.records)
    assert "urgent" in state.tombstones and state.voided == 0
    assert state.jobs["victim"].preempted_by == "urgent"


def test_a_job_still_waiting_on_a_forgotten_one_keeps_its_tombstone_past_the_window() -> None:
    """Review of #11: a dependent queued before the window ran out must not be cancelled
    as "depends on unknown job" when the window passes while it still waits."""
    log = LogBuilder()
    log.register("n1", 1)
    log.run_to_queue("j1", gpus=1)
    log.place("j1", "n1", [0])
    log.start("j1", "n1")
    log.finish("j1", "n1", after=60)
    log.charge("j1", seconds=60)
    log.run_to_queue("blocker", gpus=1)  # holds the only GPU for more than the window
    log.place("blocker", "n1", [0])
    log.start("blocker", "n1")
    log.submit("next", make_job_spec(1, depends_on=[Dependency(job="j1")]))
    log.admit("next")
    log.queue("next")
    log.register("n2", 1, after=(RETENTION + timedelta(hours=1)).total_seconds())
    forgetting, keeping = log.state(), log.state(keep_history=True)
    assert "j1" in forgetting.tombstones and "j1" not in forgetting.jobs
    assert [d.event for d in decide_queue(forgetting)] == [d.event for d in decide_queue(keeping)]
    placed = [d.event for d in placement_cycle(forgetting, BestFit())]
    assert placed == [d.event for d in placement_cycle(keeping, BestFit())]
    assert [(type(e).__name__, e.job_id) for e in placed] == [("JobPlaced", "next")]

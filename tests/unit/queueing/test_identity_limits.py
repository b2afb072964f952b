"""Limits per user and account (LimitsSet): folded; `max_submit_jobs` and
`max_array_size` enforced by admission in submission order; `max_gpus` holding jobs
back in placement with the reason AssocGrpGRES."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuloom.decide.admission import decide_admission
from gpuloom.decide.explain import explain
from gpuloom.events import Decision, JobAdmitted, JobArraySubmitted, JobRejected, LimitsSet
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.policies import BestFit
from gpuloom.queueing.quota import QuotaBook
from gpuloom.state.retention import final_phase
from gpuloom.state.tenancy import IdentityLimits
from gpuloom.testing.builders import LogBuilder, make_job_spec


def test_limits_are_replaced_whole_and_all_none_removes_them() -> None:
    log = LogBuilder()
    log.append(LimitsSet(scope="user", name="alice", max_submit_jobs=3, max_gpus=2))
    log.append(LimitsSet(scope="user", name="alice", max_gpus=4))
    log.append(LimitsSet(scope="account", name="research", max_array_size=10))
    state = log.state()
    assert state.limits == {
        ("user", "alice"): IdentityLimits(max_gpus=4),
        ("account", "research"): IdentityLimits(max_array_size=10),
    }
    log.append(LimitsSet(scope="user", name="alice"))
    assert ("user", "alice") not in log.state().limits


def test_a_user_name_that_is_no_subject_token_may_have_limits() -> None:
    event = LimitsSet(scope="user", name="alice@example.org", max_submit_jobs=1)
    log = LogBuilder()
    log.append(event)
    assert ("user", "alice@example.org") in log.state().limits


# --- admission: max_submit_jobs, max_array_size ------------------------------------------


def answers(decisions: list[Decision]) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for decision in decisions:
        event = decision.event
        assert isinstance(event, JobAdmitted | JobRejected)
        found[event.job_id] = event.reason if isinstance(event, JobRejected) else None
    return found


def cluster(**limits: int) -> LogBuilder:
    log = LogBuilder()
    log.register("n1", 4)
    log.append(LimitsSet(scope="user", name="alice", **limits))
    return log


def test_submissions_past_max_submit_jobs_are_rejected_in_submission_order() -> None:
    log = cluster(max_submit_jobs=2)
    log.run_to_queue("running", gpus=1)
    log.submit("ended", gpus=1)
    log.reject("ended")
    log.submit("second", gpus=1)
    log.submit("third", gpus=1)  # both passed a gateway that had not folded the other
    log.submit("bobs", gpus=1, user="bob")
    assert answers(decide_admission(log.state())) == {
        "second": None,
        "third": "user alice has 2 jobs submitted, the maximum is 2 (max_submit_jobs)",
        "bobs": None,
    }


def test_an_accounts_max_submit_jobs_counts_every_user_of_it() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.append(LimitsSet(scope="account", name="research", max_submit_jobs=1))
    log.submit("a", user="alice")
    log.submit("b", user="bob")
    log.submit("c", user="carol", account="other")
    assert answers(decide_admission(log.state())) == {
        "a": None,
        "b": "account research has 1 jobs submitted, the maximum is 1 (max_submit_jobs)",
        "c": None,
    }


def test_an_array_counts_as_its_tasks_and_is_answered_whole() -> None:
    log = cluster(max_submit_jobs=4)
    log.run_to_queue("one", gpus=1)
    log.append(JobArraySubmitted(job_id="fits", spec=make_job_spec(1, array=3)))
    log.append(JobArraySubmitted(job_id="over", spec=make_job_spec(1, array=2)))
    found = answers(decide_admission(log.state()))  # one answer per array, on its id
    assert found["fits"] is None
    reason = (
        "user alice has 4 jobs submitted, and this submission adds 2, the maximum is 4 "
        "(max_submit_jobs)"
    )
    assert found["over"] == reason
    log.record_decisions(decide_admission(log.state()))
    state = log.state()
    assert [state.jobs[f"fits-{i}"].phase for i in range(3)] == ["admitted"] * 3
    assert [final_phase(state, f"over-{i}") for i in range(2)] == ["rejected"] * 2


def test_an_array_over_max_array_size_is_rejected_whole() -> None:
    log = cluster(max_array_size=2)
    log.append(JobArraySubmitted(job_id="sweep", spec=make_job_spec(1, array=3)))
    found = answers(decide_admission(log.state()))
    assert set(found.values()) == {
        "user alice may submit job arrays of at most 2 tasks, this one has 3 (max_array_size)"
    }


# --- placement: max_gpus -----------------------------------------------------------------


def test_a_job_that_would_pass_max_gpus_waits_with_the_reason_and_others_go_by() -> None:
    log = cluster(max_gpus=2)
    log.register("n2", 4)
    log.run_to_queue("held", gpus=2)
    log.place("held", "n1", [0, 1])
    log.start("held", "n1")
    log.run_to_queue("more", gpus=1)
    log.run_to_queue("bobs", gpus=1, user="bob")
    state = log.state()
    placed = [d.event.job_id for d in placement_cycle(state, BestFit())]
    assert placed == ["bobs"]
    found = explain(state, "more")
    assert found is not None and found.reason == "AssocGrpGRES"
    assert found.detail == (
        "AssocGrpGRES: user alice holds 2 GPUs and the job needs 1, the maximum is 2 (max_gpus)"
    )
    brief = explain(state, "more", brief=True)
    assert brief is not None and brief.reason == "AssocGrpGRES"


def test_max_gpus_counts_the_jobs_placed_in_the_same_pass() -> None:
    log = cluster(max_gpus=3)
    for name in ("a", "b", "c"):
        log.run_to_queue(name, gpus=2)
    placed = [d.event.job_id for d in placement_cycle(log.state(), BestFit())]
    assert placed == ["a"], "a takes 2 of alice's 3; b and c would pass them"


def test_a_fraction_counts_as_its_share_of_a_gpu() -> None:
    book = QuotaBook(identity_caps={("user", "alice"): 1000})
    book.take("research", {"gpu_milli": 500}, user="alice")
    assert book.why_not("research", {"gpu_milli": 500}, user="alice") is None
    book.take("research", {"gpu_milli": 500}, user="alice")
    assert book.why_not("research", {"gpu_milli": 250}, user="alice") == (
        "AssocGrpGRES: user alice holds 1 GPUs and the job needs 0.25, the maximum is 1 (max_gpus)"
    )
    assert book.why_not("research", {"gpu_milli": 250}) is None, "no user: no identity check"


USERS = ["alice", "bob", "carol"]


@settings(max_examples=60, deadline=None)
@given(
    jobs=st.lists(st.tuples(st.sampled_from(USERS), st.integers(1, 3)), min_size=1, max_size=10),
    caps=st.fixed_dictionaries({user: st.none() | st.integers(0, 4) for user in USERS}),
    account_cap=st.none() | st.integers(0, 6),
)
def test_placement_never_takes_a_user_or_account_past_max_gpus(
    jobs: list[tuple[str, int]], caps: dict[str, int | None], account_cap: int | None
) -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.register("n2", 4)
    for user, cap in caps.items():
        if cap is not None:
            log.append(LimitsSet(scope="user", name=user, max_gpus=cap))
    if account_cap is not None:
        log.append(LimitsSet(scope="account", name="research", max_gpus=account_cap))
    for number, (user, count) in enumerate(jobs):
        log.run_to_queue(f"j{number}", gpus=count, user=user)
    for _ in range(2):  # a second pass sees the first one's placements in the log
        log.record_decisions(placement_cycle(log.state(), BestFit()))
    state = log.state()
    held: dict[str, int] = {}
    for job in state.jobs.values():
        if job.phase == "placed":
            held[job.spec.user] = held.get(job.spec.user, 0) + job.spec.gpus
    for user, cap in caps.items():
        assert cap is None or held.get(user, 0) <= cap
    assert account_cap is None or sum(held.values()) <= account_cap
    assert state.voided == 0

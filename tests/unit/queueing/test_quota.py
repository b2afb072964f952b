"""Quotas with borrowing: nominal, what siblings leave idle, the borrowing limit, the cap."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gpuloom.decide.explain import explain
from gpuloom.events import AccountCreated, QuotaSet
from gpuloom.placement import BestFit, placement_cycle
from gpuloom.queueing.quota import Quota, QuotaTracker
from gpuloom.testing.builders import LogBuilder


def cohort(**used: int) -> QuotaTracker:
    quotas = {
        "a": Quota("org", nominal=2000, borrowing_limit=1000, cap=4000),
        "b": Quota("org", nominal=2000),
        "free": Quota("org", nominal=None),
    }
    return QuotaTracker(quotas, dict(used))


def test_within_nominal_then_borrowing_then_the_limits() -> None:
    assert cohort().why_not("a", 2000) is None
    assert cohort(a=2000).why_not("a", 1000) is None  # borrows 1000 of b's idle 2000
    assert "limit is 1000" in (cohort(a=2000).why_not("a", 1500) or "")
    assert "lends only 500" in (cohort(a=2000, b=1500).why_not("a", 1000) or "")
    assert cohort().why_not("free", 10**9) is None  # no quota: not limited
    assert cohort().why_not("unknown", 10**9) is None
    capped = QuotaTracker({"a": Quota(None, nominal=1000, cap=1500), "b": Quota(None, 9000)})
    assert "cap of 1500" in (capped.why_not("a", 2000) or "")


@given(demands=st.lists(st.tuples(st.sampled_from(["a", "b"]), st.integers(1, 1500)), max_size=30))
def test_an_admitted_take_borrows_only_what_the_cohort_leaves_idle(
    demands: list[tuple[str, int]],
) -> None:
    tracker = cohort()
    nominal = {"a": 2000, "b": 2000}
    for account, demand in demands:
        if tracker.why_not(account, demand) is not None:
            continue
        other = "b" if account == "a" else "a"
        idle_before = max(0, nominal[other] - tracker.used.get(other, 0))
        borrowed_before = max(0, tracker.used.get(account, 0) - nominal[account])
        tracker.take(account, demand)
        borrowed = max(0, tracker.used[account] - nominal[account])
        assert borrowed - borrowed_before <= idle_before
    assert tracker.used.get("a", 0) <= min(4000, 2000 + 1000)  # cap, nominal + borrowing limit


def test_a_job_over_its_quota_is_held_and_explained() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.append(AccountCreated(account="team"))
    log.append(QuotaSet(account="team", nominal=1000))
    log.run_to_queue("one", gpus=1, account="team")
    log.run_to_queue("two", gpus=1, account="team")
    log.run_to_queue("other", gpus=1, account="research")
    decisions = placement_cycle(log.state(), BestFit())
    assert [d.event.job_id for d in decisions] == ["one", "other"]  # type: ignore[attr-defined]
    log.record_decisions(decisions)
    found = explain(log.state(), "two")
    assert found is not None and found.reason == "QuotaExceeded"
    assert (
        found.detail
        == "QuotaExceeded: 2000 milli-GPU against a nominal 1000, and the cohort lends only 0"
    )
    log.start("one", "n1")
    log.finish("one", "n1", outcome="succeeded")
    [decision] = placement_cycle(log.state(), BestFit())
    assert decision.event.job_id == "two"  # type: ignore[attr-defined]


def test_a_model_quota_steers_jobs_to_other_models_and_holds_those_that_need_it() -> None:
    log = LogBuilder()
    log.register("a", 2, "A100-80GB")
    log.register("h", 2, "H100-80GB")
    log.append(AccountCreated(account="team"))
    log.append(QuotaSet(account="team", resource="model:H100-80GB", nominal=1000))
    log.run_to_queue("h1", gpus=1, account="team", gpu_model=["H100-80GB"])
    log.run_to_queue("h2", gpus=1, account="team", gpu_model=["H100-80GB"])
    log.run_to_queue("any1", gpus=1, account="team")
    log.run_to_queue("any2", gpus=1, account="team")
    decisions = placement_cycle(log.state(), BestFit())
    placed = {d.event.job_id: d.event.node for d in decisions}  # type: ignore[attr-defined]
    assert placed == {"h1": "h", "any1": "a", "any2": "a"}, (
        "h2 would pass the H100 quota; any1 and any2 are steered to the A100s"
    )
    log.record_decisions(decisions)
    found = explain(log.state(), "h2")
    assert found is not None and found.reason == "QuotaExceeded"
    assert found.detail == (
        "QuotaExceeded: 2000 milli-GPU of model:H100-80GB against a nominal 1000, "
        "and the cohort lends only 0"
    )


def test_a_quota_of_whole_gpus_counts_whole_gpus() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.append(AccountCreated(account="few"))
    log.append(QuotaSet(account="few", resource="gpus", nominal=1))
    log.run_to_queue("one", gpus=1, account="few")
    log.run_to_queue("two", gpus=1, account="few")
    decisions = placement_cycle(log.state(), BestFit())
    assert [d.event.job_id for d in decisions] == ["one"]  # type: ignore[attr-defined]
    log.record_decisions(decisions)
    found = explain(log.state(), "two")
    assert found is not None and found.detail == (
        "QuotaExceeded: 2 GPUs against a nominal 1, and the cohort lends only 0"
    )

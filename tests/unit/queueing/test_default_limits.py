"""Limits are on by default (issue #36): a user's unset limit is the operators' default,
else the built-in one; the cluster's total holds every user together; the fold's
running counts are what the limits read."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpuloom.decide.admission import decide_admission
from gpuloom.events import JobAdmitted, JobArraySubmitted, JobRejected, LimitsSet
from gpuloom.queueing.limits import (
    BUILT_IN,
    BUILT_IN_CLUSTER,
    active_counts,
    cluster_limits,
    default_limits,
    limits_of,
)
from gpuloom.state.tenancy import CLUSTER_TOTAL, IdentityLimits
from gpuloom.testing.builders import LogBuilder, make_job_spec


def answers(log: LogBuilder) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    for decision in decide_admission(log.state()):
        event = decision.event
        assert isinstance(event, JobAdmitted | JobRejected)
        found[event.job_id] = event.reason if isinstance(event, JobRejected) else None
    return found


def test_with_nothing_set_the_built_in_limits_hold() -> None:
    state = LogBuilder().state()
    assert limits_of(state, "user", "alice") == BUILT_IN["user"]
    assert BUILT_IN["user"].max_submit_jobs is not None
    assert BUILT_IN["user"].max_array_size is not None
    assert cluster_limits(state) == BUILT_IN_CLUSTER


def test_a_users_own_limit_then_the_default_then_the_built_in_one_limit_by_limit() -> None:
    log = LogBuilder()
    log.append(LimitsSet(scope="default", name="user", max_array_size=50))
    log.append(LimitsSet(scope="user", name="alice", max_submit_jobs=7))
    state = log.state()
    assert limits_of(state, "user", "alice") == IdentityLimits(max_submit_jobs=7, max_array_size=50)
    assert limits_of(state, "user", "bob") == IdentityLimits(
        max_submit_jobs=BUILT_IN["user"].max_submit_jobs, max_array_size=50
    )
    assert default_limits(state, "account") == BUILT_IN["account"]


def test_an_array_over_the_built_in_size_is_rejected_naming_the_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(BUILT_IN, "user", IdentityLimits(max_submit_jobs=100, max_array_size=3))
    log = LogBuilder()
    log.register("n1", 4)
    log.append(JobArraySubmitted(job_id="big", spec=make_job_spec(1, array=4)))
    assert set(answers(log).values()) == {
        "user alice may submit job arrays of at most 3 tasks, this one has 4 "
        "(max_array_size, the built-in default for users)"
    }


def test_the_operators_default_for_users_holds_each_user_without_their_own() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.append(LimitsSet(scope="default", name="user", max_submit_jobs=1))
    log.append(LimitsSet(scope="user", name="carol", max_submit_jobs=5))
    for job, user in (("a1", "alice"), ("a2", "alice"), ("b1", "bob"), ("c1", "carol"),
                      ("c2", "carol")):  # fmt: skip
        log.submit(job, gpus=1, user=user)
    assert answers(log) == {
        "a1": None,
        "a2": "user alice has 1 jobs submitted, the maximum is 1 "
        "(max_submit_jobs, the default for users)",
        "b1": None,
        "c1": None,
        "c2": None,
    }


def test_the_cluster_total_counts_every_user_together() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.append(LimitsSet(scope="cluster", name="all", max_submit_jobs=2))
    log.submit("a", gpus=1, user="alice")
    log.submit("b", gpus=1, user="bob")
    log.submit("c", gpus=1, user="carol")
    assert answers(log)["c"] == (
        "the cluster has 2 jobs submitted, the maximum is 2 (max_submit_jobs of the cluster)"
    )


def test_the_fold_counts_live_jobs_and_forgets_them_when_they_end() -> None:
    log = LogBuilder()
    log.register("n1", 4)
    log.run_to_queue("q", gpus=1)
    log.submit("s", gpus=1, user="bob", account="team-b")
    state = log.state()
    assert state.live_jobs[("user", "alice")] == 1
    assert state.live_jobs[("account", "team-b")] == 1
    assert state.live_jobs[CLUSTER_TOTAL] == 2
    assert active_counts(state, with_submitted=False)[CLUSTER_TOTAL] == 1
    log.reject("s")
    assert ("user", "bob") not in log.state().live_jobs


@pytest.mark.parametrize(
    ("scope", "name", "limits", "match"),
    [
        ("default", "alice", {"max_submit_jobs": 1}, "the default scope's name is user or account"),
        ("cluster", "everyone", {"max_submit_jobs": 1}, "the cluster scope's name is all"),
        ("default", "user", {"max_gpus": 1}, "max_gpus is set per user or account"),
        ("cluster", "all", {"max_array_size": 5}, "max_array_size is set per user or account"),
    ],
    ids=["a default of a name", "a cluster of a name", "a default max_gpus", "a cluster array"],
)
def test_scopes_refuse_what_they_cannot_mean(
    scope: str, name: str, limits: dict[str, int], match: str
) -> None:
    with pytest.raises(ValidationError, match=match):
        LimitsSet(scope=scope, name=name, **limits)  # type: ignore[arg-type]

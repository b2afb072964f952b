"""Who may see a job's events is one rule (`gpuloom.auth.visibility`), read by the
event stream, the webhooks and `GET /v1/jobs/{id}/events`: they decide alike."""

from __future__ import annotations

import pytest

from gpuloom.auth import OPERATOR, Principal
from gpuloom.auth.visibility import (
    Owner,
    StreamFilter,
    job_events_problem,
    needs_owner,
    visible,
)
from gpuloom.events import JobFinished
from gpuloom.state.tenancy import AccountState

ALICE = Principal("alice")
BOB = Principal("bob")
CAROL = Principal("carol")  # coordinates `research`
ROOT = Principal("root", frozenset({OPERATOR}))
ACCOUNTS = {
    "research": AccountState(
        name="research", parent=None, users=("alice",), coordinators=("carol",)
    ),
    "ops": AccountState(name="ops", parent=None, users=("bob",)),
}
PRINCIPALS = [ALICE, BOB, CAROL, ROOT]
OWNERS: list[Owner | None] = [("alice", "research"), ("bob", "ops"), None]


@pytest.mark.parametrize(
    ("principal", "owner", "sees"),
    [
        (ALICE, ("alice", "research"), True),
        (BOB, ("alice", "research"), False),
        (CAROL, ("alice", "research"), True),
        (CAROL, ("bob", "ops"), False),
        (ROOT, ("bob", "ops"), True),
        (ROOT, None, True),
        (ALICE, None, False),
    ],
    ids=[
        "a user sees their own job's",
        "not another user's",
        "a coordinator sees those of the account's jobs",
        "not those of another account's",
        "an operator sees every job's",
        "and those of a job whose owner is unknown",
        "which a user does not",
    ],
)
def test_who_sees_a_jobs_events(principal: Principal, owner: Owner | None, sees: bool) -> None:
    assert (job_events_problem(principal, owner, ACCOUNTS) is None) == sees


def test_a_refusal_says_why() -> None:
    assert job_events_problem(BOB, ("alice", "research"), ACCOUNTS) == (
        "bob may not read the events of a job of alice: only its user, a coordinator of "
        "account research or an operator may"
    )
    assert job_events_problem(ALICE, None, ACCOUNTS) is not None


def test_the_stream_and_the_rest_read_decide_alike() -> None:
    event = JobFinished(job_id="j1", attempt=1, node="n1", outcome="succeeded", exit_code=0)
    for principal in PRINCIPALS:
        for owner in OWNERS:
            allowed = job_events_problem(principal, owner, ACCOUNTS) is None
            assert visible(principal, event, owner, ACCOUNTS) == allowed, (principal, owner)


@pytest.mark.parametrize(
    ("principal", "wanted", "needed"),
    [
        (ROOT, StreamFilter(), False),
        (ROOT, StreamFilter(types=frozenset({"JobFinished"}), job="j1", node="n1"), False),
        (ROOT, StreamFilter(user="alice"), True),
        (ROOT, StreamFilter(account="research"), True),
        (ALICE, StreamFilter(), True),
    ],
    ids=[
        "an operator's stream sees every event",
        "whatever its filter by type, job or node",
        "but one by user asks who owns each job",
        "and one by account",
        "a user's stream always asks",
    ],
)
def test_a_stream_looks_owners_up_only_when_its_verdicts_need_them(
    principal: Principal, wanted: StreamFilter, needed: bool
) -> None:
    assert needs_owner(principal, wanted) == needed


def test_where_no_owner_is_needed_the_verdict_is_the_same_without_one() -> None:
    event = JobFinished(job_id="j1", attempt=1, node="n1", outcome="succeeded", exit_code=0)
    filters = [StreamFilter(), StreamFilter(job="j1"), StreamFilter(node="n2"),
               StreamFilter(user="alice"), StreamFilter(account="ops")]  # fmt: skip
    for principal in PRINCIPALS:
        for wanted in filters:
            if needs_owner(principal, wanted):
                continue
            verdicts = {
                visible(principal, event, owner, ACCOUNTS) and wanted.wants(event, owner)
                for owner in OWNERS
            }
            assert len(verdicts) == 1, (principal, wanted)

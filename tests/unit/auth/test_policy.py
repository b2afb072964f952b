"""The authorization matrix (docs/security.md), whole: every kind of principal
against every act, on a small account tree, from one table."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpuloom.auth import OPERATOR, Principal
from gpuloom.auth.policy import (
    account_problem,
    ancestry,
    coordinated,
    job_problem,
    operator_only,
    priority_problem,
    submit_problem,
    usage_scope,
)
from gpuloom.state.tenancy import AccountState, is_member

# org (coordinated by carol) > team-a (dave; members alice, bob) > team-a-1
# org > team-b (erin; anyone may submit)
ACCOUNTS = {
    "org": AccountState("org", None, coordinators=("carol",)),
    "team-a": AccountState("team-a", "org", users=("alice", "bob"), coordinators=("dave",)),
    "team-a-1": AccountState("team-a-1", "team-a"),
    "team-b": AccountState("team-b", "org", coordinators=("erin",)),
}

ALICE = Principal("alice")  # a member of team-a
MALLORY = Principal("mallory")  # a member of nothing listed
DAVE = Principal("dave")  # coordinates team-a (and team-a-1)
ERIN = Principal("erin")  # coordinates team-b: another account
CAROL = Principal("carol")  # coordinates org: the whole tree
OPS = Principal("ops", frozenset({OPERATOR}))
WHO = {"alice": ALICE, "mallory": MALLORY, "dave": DAVE, "erin": ERIN, "carol": CAROL, "ops": OPS}


def allowed(reason: str | None) -> bool:
    return reason is None


# --- submitting ---------------------------------------------------------------------

SUBMIT = [
    # who, job user, account, allowed
    ("alice", "alice", "team-a", True),
    ("alice", "alice", "team-a-1", True),  # no member list: anyone
    ("alice", "alice", "nowhere", True),  # an account nobody created takes anyone
    ("alice", "bob", "team-a", False),  # a user submits as themselves only
    ("mallory", "mallory", "team-a", False),  # not a member
    ("mallory", "mallory", "team-b", True),
    ("dave", "dave", "team-a", False),  # coordinating is not being a member
    ("dave", "alice", "team-a", False),  # nor acting for members
    ("ops", "bob", "team-a", True),  # an operator acts for another user
    ("ops", "mallory", "team-a", True),  # ... written, and left to admission to reject
]


@pytest.mark.parametrize(
    ("who", "user", "account", "ok"),
    SUBMIT,
    ids=[f"{w} submits for {u} under {a}: {'yes' if ok else 'no'}" for w, u, a, ok in SUBMIT],
)
def test_who_may_submit_for_whom_under_which_account(
    who: str, user: str, account: str, ok: bool
) -> None:
    assert allowed(submit_problem(WHO[who], user, account, ACCOUNTS)) is ok


def test_a_refused_submission_says_why() -> None:
    assert submit_problem(ALICE, "bob", "team-a", ACCOUNTS) == (
        "alice may not submit as bob: only an operator may submit for another user"
    )
    # the very words of admission's rejection
    assert submit_problem(MALLORY, "mallory", "team-a", ACCOUNTS) == (
        "user mallory may not submit under account team-a"
    )


# --- one job --------------------------------------------------------------------------

JOB_ACTS = ("details", "cancel", "logs", "events")
JOBS = [
    # who, job user, job account, allowed (every act alike)
    ("alice", "alice", "team-a", True),  # their own
    ("alice", "bob", "team-a", False),  # another member's
    ("mallory", "alice", "team-a", False),
    ("dave", "bob", "team-a", True),  # coordinator of the job's account
    ("dave", "bob", "team-a-1", True),  # ... and of the accounts below it
    ("dave", "mallory", "team-b", False),  # not of a sibling
    ("erin", "bob", "team-a", False),  # a coordinator of another account
    ("carol", "bob", "team-a-1", True),  # coordinator of the root: the whole tree
    ("carol", "bob", "nowhere", False),  # not of an account outside the tree
    ("ops", "bob", "nowhere", True),
]


@pytest.mark.parametrize("act", JOB_ACTS)
@pytest.mark.parametrize(
    ("who", "user", "account", "ok"),
    JOBS,
    ids=[f"{w} on a job of {u} under {a}: {'yes' if ok else 'no'}" for w, u, a, ok in JOBS],
)
def test_who_may_act_on_a_job(who: str, user: str, account: str, ok: bool, act: str) -> None:
    assert allowed(job_problem(WHO[who], act, user, account, ACCOUNTS)) is ok  # type: ignore[arg-type]


def test_a_refused_job_act_names_who_may() -> None:
    assert job_problem(ERIN, "cancel", "bob", "team-a", ACCOUNTS) == (
        "erin may not cancel a job of bob: only its user, a coordinator of account team-a "
        "or an operator may"
    )


# --- accounts -------------------------------------------------------------------------

ACCOUNT_ACTS = [
    # who, act, account, parent (create), allowed
    ("alice", "create", "new", None, False),
    ("alice", "create", "new", "team-a", False),
    ("dave", "create", "new", "team-a", True),  # a sub-account of theirs
    ("dave", "create", "new", "team-a-1", True),  # ... at any depth
    ("dave", "create", "new", None, False),  # not a top-level one
    ("dave", "create", "new", "team-b", False),
    ("erin", "create", "new", "team-a", False),
    ("carol", "create", "new", "team-b", True),
    ("ops", "create", "new", None, True),
    ("alice", "members", "team-a", None, False),
    ("dave", "members", "team-a", None, True),
    ("dave", "members", "team-a-1", None, True),
    ("dave", "members", "team-b", None, False),
    ("dave", "members", "org", None, False),  # not above their account
    ("erin", "members", "team-a", None, False),
    ("carol", "members", "team-a-1", None, True),
    ("ops", "members", "team-a", None, True),
    ("alice", "shares", "team-a-1", None, False),
    ("dave", "shares", "team-a-1", None, True),  # a sub-account's share of theirs
    ("dave", "shares", "team-a", None, False),  # not their own share of the parent's
    ("erin", "shares", "team-a-1", None, False),
    ("carol", "shares", "team-a", None, True),
    ("carol", "shares", "org", None, False),  # a root's share: operators
    ("ops", "shares", "org", None, True),
    ("dave", "quota", "team-a", None, False),  # quotas: operators only
    ("carol", "quota", "team-a-1", None, False),
    ("ops", "quota", "team-a", None, True),
    ("dave", "coordinators", "team-a-1", None, False),  # coordinators: operators only
    ("carol", "coordinators", "team-a", None, False),
    ("ops", "coordinators", "team-a", None, True),
]


@pytest.mark.parametrize(
    ("who", "act", "account", "parent", "ok"),
    ACCOUNT_ACTS,
    ids=[
        f"{w} {act} {a}{f' under {p}' if p else ''}: {'yes' if ok else 'no'}"
        for w, act, a, p, ok in ACCOUNT_ACTS
    ],
)
def test_who_may_change_which_account(
    who: str, act: str, account: str, parent: str | None, ok: bool
) -> None:
    reason = account_problem(WHO[who], act, account, ACCOUNTS, parent)  # type: ignore[arg-type]
    assert allowed(reason) is ok


# --- the cluster and usage -------------------------------------------------------------


@pytest.mark.parametrize("who", sorted(WHO))
def test_only_operators_act_on_the_cluster(who: str) -> None:
    reason = operator_only(WHO[who], "cordon nodes")
    assert allowed(reason) is (who == "ops")
    if reason is not None:
        assert reason == f"{who} may not cordon nodes: it needs the operator role"


USAGE = [
    # who, sees the charges of (user, account) ...
    ("alice", [("alice", "team-a"), ("alice", "nowhere")], [("bob", "team-a")]),
    ("dave", [("bob", "team-a"), ("bob", "team-a-1"), ("dave", "x")], [("bob", "team-b")]),
    ("carol", [("bob", "team-b"), ("x", "team-a-1")], [("bob", "nowhere")]),
]


@pytest.mark.parametrize(("who", "sees", "hidden"), USAGE, ids=[row[0] for row in USAGE])
def test_usage_is_ones_own_and_that_of_the_accounts_one_coordinates(
    who: str, sees: list[tuple[str, str]], hidden: list[tuple[str, str]]
) -> None:
    scope = usage_scope(WHO[who], ACCOUNTS)
    assert scope is not None
    assert all(scope.covers(user, account) for user, account in sees)
    assert not any(scope.covers(user, account) for user, account in hidden)


def test_an_operator_sees_all_usage() -> None:
    assert usage_scope(OPS, ACCOUNTS) is None


# --- properties -------------------------------------------------------------------------

names = st.sampled_from(["alice", "bob", "dave", "erin", "carol", "zed"])
account_names = st.sampled_from([*ACCOUNTS, "nowhere"])


@given(who=names, user=names, account=account_names)
def test_an_operator_may_do_anything_a_user_may(who: str, user: str, account: str) -> None:
    operator = Principal(who, frozenset({OPERATOR}))
    for act in JOB_ACTS:
        assert job_problem(operator, act, user, account, ACCOUNTS) is None  # type: ignore[arg-type]
    assert submit_problem(operator, user, account, ACCOUNTS) is None


@given(who=names, account=account_names)
def test_coordinating_an_account_covers_every_account_below_it(who: str, account: str) -> None:
    principal = Principal(who)
    mine = coordinated(principal, ACCOUNTS)
    for name in ACCOUNTS:
        if any(above in mine for above in ancestry(name, ACCOUNTS)):
            assert name in mine
    # a user's own job is always theirs, whatever they coordinate
    assert job_problem(principal, "cancel", who, account, ACCOUNTS) is None


def test_ancestry_stops_on_a_cycle_of_bad_facts() -> None:
    loop = {"a": AccountState("a", "b"), "b": AccountState("b", "a")}
    assert list(ancestry("a", loop)) == ["a", "b"]
    assert not is_member("x", "team-a", ACCOUNTS) and is_member("x", "team-b", ACCOUNTS)


def test_only_an_operator_may_ask_a_priority_over_the_class() -> None:
    user = Principal(name="alice")
    ops = Principal(name="ops", roles=frozenset({OPERATOR}))
    assert priority_problem(user, 100, "team", 100) is None
    assert priority_problem(user, 101, "team", 100) == (
        "priority 101 is over the maximum of priority class team (100); only an operator "
        "may set it higher"
    )
    assert priority_problem(ops, 1_000_000, "team", 100) is None

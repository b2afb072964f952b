"""The public stream's pure parts: the CloudEvents form of an event, the filters, and
who sees what."""

from __future__ import annotations

from gpuloom.auth import OPERATOR
from gpuloom.auth.tokens import Principal
from gpuloom.auth.visibility import StreamFilter, visible
from gpuloom.client.sse import SseEvent, parse_sse
from gpuloom.events import (
    AccountCreated,
    AccountUsersSet,
    JobFinished,
    NodeLost,
)
from gpuloom.events.cloud import to_cloudevent
from gpuloom.events.registry import EVENT_TYPES
from gpuloom.state.tenancy import AccountState
from gpuloom.testing.builders import LogBuilder

ALICE = Principal("alice", frozenset())
BOB = Principal("bob", frozenset())
ROOT = Principal("root", frozenset({OPERATOR}))


def test_an_event_becomes_a_cloudevent_with_its_sequence_and_current_schema() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    submitted = log.submit("j1", gpus=1)
    cloud = to_cloudevent(submitted)
    assert cloud["specversion"] == "1.0"
    assert cloud["id"] == submitted.envelope.id
    version = EVENT_TYPES["JobSubmitted"].VERSION
    assert cloud["type"] == f"io.gpuloom.job.JobSubmitted.v{version}"
    assert (cloud["subject"], cloud["gpuloomseq"]) == ("job/j1", submitted.seq)
    assert cloud["source"] == "/gpuloom/test"
    assert cloud["time"] == submitted.envelope.at.isoformat()
    assert cloud["data"]["spec"]["user"] == "alice"
    assert cloud["dataschema"] == "/v1/schemas/events#JobSubmitted"
    assert "gpuloomprincipal" not in cloud


def test_the_filters_keep_what_was_asked() -> None:
    finished = JobFinished(job_id="arr-3", attempt=1, node="n1", outcome="succeeded", exit_code=0)
    lost = NodeLost(node="n1", reason="silent")
    alice = ("alice", "research")
    assert StreamFilter().wants(finished, alice)
    assert StreamFilter(types=frozenset({"JobFinished"})).wants(finished, alice)
    assert not StreamFilter(types=frozenset({"JobStarted"})).wants(finished, alice)
    assert StreamFilter(job="arr-3").wants(finished, alice)
    assert not StreamFilter(job="arr").wants(finished, alice)
    assert StreamFilter(user="alice").wants(finished, alice)
    assert not StreamFilter(user="bob").wants(finished, alice)
    assert StreamFilter(account="research").wants(finished, alice)
    assert StreamFilter(node="n1").wants(finished, alice) and StreamFilter(node="n1").wants(
        lost, None
    )
    assert not StreamFilter(node="n2").wants(lost, None)
    assert not StreamFilter(user="alice").wants(lost, None)
    assert StreamFilter(account="research").wants(AccountCreated(account="research"), None)


def test_a_user_sees_their_jobs_and_accounts_and_the_cluster_not_other_users_jobs() -> None:
    accounts = {
        "research": AccountState(name="research", parent=None, users=("alice",)),
        "ops": AccountState(name="ops", parent=None, users=("bob",)),
    }
    mine = JobFinished(job_id="a1", attempt=1, node="n1", outcome="succeeded", exit_code=0)
    assert visible(ALICE, mine, ("alice", "research"), accounts)
    assert not visible(BOB, mine, ("alice", "research"), accounts)
    assert not visible(BOB, mine, None, accounts)  # an owner nobody knows: operators only
    assert visible(ROOT, mine, None, accounts)
    assert visible(ALICE, AccountUsersSet(account="research", users=["alice"]), None, accounts)
    assert not visible(ALICE, AccountUsersSet(account="ops", users=["bob"]), None, accounts)
    assert visible(BOB, NodeLost(node="n1", reason="silent"), None, accounts)


def test_the_sse_parser_follows_the_standard() -> None:
    lines = [": ping", "id: 7", 'data: {"a":', "data: 1}", "", "event: error", "data: x", ""]
    assert list(parse_sse(lines)) == [
        SseEvent('{"a":\n1}', "message", "7"),
        SseEvent("x", "error", "7"),
    ]

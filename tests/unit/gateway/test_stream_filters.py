"""The public stream's pure parts: the CloudEvents form of an event, the filters, and
who sees what."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any, cast

import pytest

from gpuloom.auth import OPERATOR
from gpuloom.auth.tokens import Principal
from gpuloom.bus import EventBus, Incoming
from gpuloom.client.sse import SseEvent, parse_sse
from gpuloom.events import (
    AccountCreated,
    AccountUsersSet,
    JobFinished,
    NodeLost,
    encode,
    subject_for,
)
from gpuloom.events.cloud import to_cloudevent
from gpuloom.events.registry import EVENT_TYPES
from gpuloom.state import ClusterState
from gpuloom.state.model import AccountState
from gpuloom.testing.builders import LogBuilder
from services.gateway import stream
from services.gateway.stream import Owners, StreamFilter, event_stream, visible

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


# --- the stream's ends, on a log in memory ----------------------------------------------


class MemoryLog:
    """What `event_stream` needs of the bus: the log's figures and a follower."""

    def __init__(self, records: list[Any], first_seq: int = 1) -> None:
        self.records = records
        self.first_seq = first_seq

    async def stream_figures(self) -> Any:
        last = self.records[-1].seq if self.records else 0
        return SimpleNamespace(first_seq=self.first_seq, last_seq=last)

    async def follow(self, deliver: Any, *, from_seq: int, subjects: str = "") -> Any:
        async def run() -> None:
            for record in self.records:
                if record.seq >= from_seq:
                    body = encode(record.envelope)
                    await deliver(Incoming(record.seq, subject_for(record.event), body, {}, 0))

        task = asyncio.create_task(run())

        async def stop() -> None:
            task.cancel()

        return stop


def stream_of(log: MemoryLog, after: int) -> Any:
    owners = Owners(lambda: ClusterState(), _no_owner)
    return event_stream(cast(EventBus, log), after, StreamFilter(), ROOT, owners, dict)


async def _no_owner(job_id: str) -> None:
    return None


async def test_a_position_the_log_no_longer_holds_gets_an_error_event() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    got = [e async for e in stream_of(MemoryLog(log.records, first_seq=50), after=10)]
    assert [(e.event, e.data["reason"], e.data["resume_after"]) for e in got] == [
        ("error", "gone", 49)
    ]


async def test_a_client_that_takes_nothing_is_ended_with_where_to_resume(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stream, "BUFFER", 2)
    monkeypatch.setattr(stream, "SLOW_AFTER_S", 0.05)
    log = LogBuilder()
    for i in range(6):
        log.register(f"n{i}", 1)
    events = stream_of(MemoryLog(log.records), after=0)
    opened, first = await anext(events), await anext(events)
    await asyncio.sleep(0.2)  # the client reads nothing: the buffer fills, then it is slow
    rest = [e async for e in events]
    assert (opened.event, opened.id, first.id) == ("open", "0", "1")
    assert [e.id for e in rest[:-1]] == ["2", "3"]  # what was buffered, then the end
    assert (rest[-1].event, rest[-1].data["reason"], rest[-1].data["resume_after"]) == (
        "error", "slow", 3,
    )  # fmt: skip


def test_the_sse_parser_follows_the_standard() -> None:
    lines = [": ping", "id: 7", 'data: {"a":', "data: 1}", "", "event: error", "data: x", ""]
    assert list(parse_sse(lines)) == [
        SseEvent('{"a":\n1}', "message", "7"),
        SseEvent("x", "error", "7"),
    ]

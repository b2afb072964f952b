"""Dead letters without a server: what a reactor dead-letters, what a letter holds,
and how the outbox publishes (in order, once per seq, never blocking, never raising)."""

from __future__ import annotations

import asyncio
import base64
import importlib
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import orjson
import pytest
from nats.js import JetStreamContext
from nats.js.api import StorageType, StreamConfig
from nats.js.errors import NotFoundError

from gpuloom.bus import DeadLetter, DeadLetters, EventBus, Incoming
from gpuloom.bus.deadletters import MAX_QUEUED, ReasonKind, envelope_id_of, excerpt_of
from gpuloom.bus.streams import Expected, differences, log_config
from gpuloom.events import JobSubmitted, encode, make_envelope, subject_for
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.testing.builders import make_job_spec

AT = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
fold_module = importlib.import_module("gpuloom.state.fold")


def submitted(job_id: str) -> Incoming:
    event = JobSubmitted(job_id=job_id, spec=make_job_spec())
    body = encode(make_envelope(event, at=AT, by="test", event_id=f"id-{job_id}"))
    return Incoming(seq=0, subject=subject_for(event), body=body, headers={}, pending=0)


def at_seq(message: Incoming, seq: int) -> Incoming:
    return Incoming(seq, message.subject, message.body, message.headers, 0)


# --- what the reactor dead-letters ------------------------------------------------------


@dataclass
class Recorder:
    letters: list[tuple[int, ReasonKind, str, str | None]] = field(default_factory=list)

    def from_log(
        self, message: Incoming, kind: ReasonKind, reason: str, envelope_id: str | None = None
    ) -> None:
        self.letters.append((message.seq, kind, reason, envelope_id))


class RecordingBus:
    stream = "GPULOOM"

    def __init__(self) -> None:
        self.outbox = Recorder()

    def dead_letters(self, service: str) -> Recorder:
        return self.outbox


def reactor(**options: Any) -> tuple[Reactor, Recorder]:
    bus = RecordingBus()
    return Reactor(cast(EventBus, bus), "test", pure(lambda state: []), **options), bus.outbox


def test_garbage_on_the_log_is_dead_lettered_and_folding_goes_on() -> None:
    folding, outbox = reactor()
    folding.follower.fold(Incoming(1, "gpuloom.evt.job.x.JobSubmitted", b"\x00garbage", {}, 0))
    folding.follower.fold(at_seq(submitted("j1"), 2))
    assert [(seq, kind) for seq, kind, _, _ in outbox.letters] == [(1, "malformed")]
    assert "not an event envelope" in outbox.letters[0][2]
    assert folding.state.seq == 2 and "j1" in folding.state.jobs


def test_an_event_whose_time_has_no_zone_is_dead_lettered_and_folding_goes_on() -> None:
    folding, outbox = reactor()
    aware = submitted("naive")
    naive = aware.body.replace(b'"2026-12-03T10:00:00Z"', b'"2026-12-03T10:00:00"')
    naive = naive.replace(b'"2026-12-03T10:00:00+00:00"', b'"2026-12-03T10:00:00"')
    assert naive != aware.body
    folding.follower.fold(Incoming(1, aware.subject, naive, {}, 0))
    folding.follower.fold(at_seq(submitted("j1"), 2))
    [(seq, kind, reason, envelope_id)] = outbox.letters
    assert (seq, kind, envelope_id) == (1, "malformed", None)  # the outbox finds it:
    assert envelope_id_of(naive) == "id-naive"
    assert "timezone" in reason
    assert "naive" not in folding.state.jobs and "j1" in folding.state.jobs


def test_an_event_a_fold_rule_fails_on_is_dead_lettered_as_a_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*_: object) -> None:
        raise KeyError("a rule that did not expect this")

    monkeypatch.setitem(fold_module._HANDLERS, JobSubmitted, broken)
    folding, outbox = reactor()
    folding.follower.fold(at_seq(submitted("j1"), 1))
    [(seq, kind, reason, envelope_id)] = outbox.letters
    assert (seq, kind, envelope_id) == (1, "fault", "id-j1")
    assert "KeyError" in reason and folding.state.faults == 1


def test_an_ordinary_voided_event_is_not_a_dead_letter() -> None:
    folding, outbox = reactor()
    folding.follower.fold(at_seq(submitted("j1"), 1))
    folding.follower.fold(at_seq(submitted("j1"), 2))  # submitted twice: voided, a normal race
    assert folding.state.voided == 1 and outbox.letters == []


def test_a_failing_observer_after_the_fold_costs_the_event_not_the_service() -> None:
    class Broken:
        def before(self, recorded: object) -> None:
            pass

        def after(self, message: object, recorded: object, folded: object) -> None:
            raise RuntimeError("observer bug")

    folding, outbox = reactor(observers=[Broken()])
    folding.follower.fold(at_seq(submitted("j1"), 1))
    assert [(seq, kind) for seq, kind, _, _ in outbox.letters] == [(1, "fault")]
    assert folding.state.seq == 1


# --- what a dead letter holds -----------------------------------------------------------


def test_a_dead_letter_keeps_a_bounded_excerpt_the_reason_and_where_it_came_from() -> None:
    letter = DeadLetter(
        service="queue",
        source="log",
        subject="gpuloom.evt.job.x.JobSubmitted",
        reason_kind="malformed",
        reason="r" * 5000,
        body=b"{" + b"x" * 10_000,
        at=AT,
        seq=7,
        envelope_id="01J",
    )
    doc = orjson.loads(letter.encode())
    assert letter.msg_id() == "queue:7"
    assert (doc["service"], doc["seq"], doc["subject"]) == ("queue", 7, letter.subject)
    assert (doc["size"], doc["excerpt_encoding"], len(doc["excerpt"])) == (10_001, "utf-8", 2048)
    assert len(doc["reason"]) == 1000 and doc["envelope_id"] == "01J"


def test_binary_is_kept_as_base64_and_a_cut_character_is_not() -> None:
    assert excerpt_of(b"\xff\x00abc") == (base64.b64encode(b"\xff\x00abc").decode(), "base64")
    text, encoding = excerpt_of("é".encode() * 2000, limit=2047)
    assert (encoding, len(text)) == ("utf-8", 1023)


# --- the log's configuration ------------------------------------------------------------


def test_differences_name_what_this_process_expected_and_ignore_limits() -> None:
    expected = Expected(dedup_window_s=7200, replicas=3)
    same = log_config("GPULOOM", expected)
    same.max_msgs, same.max_bytes = 1_000_000, 2**30  # an operator's limits: theirs
    assert differences(same, expected) == []
    found = StreamConfig(
        name="GPULOOM",
        subjects=["gpuloom.evt.>", "other.>"],
        storage=StorageType.MEMORY,
        num_replicas=1,
        duplicate_window=60,
        allow_direct=False,
    )
    lines = differences(found, expected)
    assert [line.split(" ")[0] for line in lines] == [
        "replicas",
        "duplicate",
        "subjects",
        "storage",
        "allow_direct",
    ]
    assert differences(found, Expected())[0].startswith("subjects")  # no expectation given


# --- the outbox -------------------------------------------------------------------------


@dataclass
class Ack:
    seq: int
    duplicate: bool = False


class FakeJetStream:
    def __init__(self, covered_seq: int | None, fail_on: int | None = None) -> None:
        self.covered_seq = covered_seq
        self.fail_on = fail_on
        self.published: list[tuple[str, dict[str, Any], dict[str, str] | None]] = []

    async def get_last_msg(self, stream: str, subject: str) -> Any:
        assert (stream, subject) == ("GPULOOM_DLQ", "gpuloom.dlq.queue.log")
        if self.covered_seq is None:
            raise NotFoundError
        return type("Raw", (), {"data": orjson.dumps({"seq": self.covered_seq})})()

    async def publish(self, subject: str, body: bytes, **kw: Any) -> Ack:
        doc = orjson.loads(body)
        if doc["seq"] == self.fail_on:
            raise TimeoutError("nats: timeout")
        assert kw["stream"] == "GPULOOM_DLQ"
        self.published.append((subject, doc, kw["headers"]))
        return Ack(len(self.published))


def outbox(js: FakeJetStream) -> DeadLetters:
    return DeadLetters(cast(JetStreamContext, js), "GPULOOM", "queue")


def letter(seq: int) -> DeadLetter:
    return DeadLetter("queue", "log", "s", "malformed", "why", b"x", AT, seq=seq)


async def test_the_outbox_publishes_in_order_once_per_seq_and_survives_a_failure() -> None:
    js = FakeJetStream(covered_seq=3, fail_on=5)
    box = outbox(js)
    for seq in (2, 3, 4, 5, 6):  # 2 and 3 were dead-lettered by an earlier process
        box.put(letter(seq))
    await box.flush(5)
    assert [doc["seq"] for _, doc, _ in js.published] == [4, 6]
    assert [headers for _, _, headers in js.published] == [
        {"Nats-Msg-Id": "queue:4"},
        {"Nats-Msg-Id": "queue:6"},
    ]
    assert js.published[0][0] == "gpuloom.dlq.queue.log"
    assert (box.published, box.dropped) == (2, 1)


async def test_the_outbox_is_bounded_and_put_never_blocks() -> None:
    js = FakeJetStream(covered_seq=None)
    box = outbox(js)
    for seq in range(1, MAX_QUEUED + 11):
        box.put(letter(seq))  # no await between: the sender has not run yet
    assert box.dropped == 10
    await box.flush(10)
    assert len(js.published) == MAX_QUEUED
    await asyncio.sleep(0)

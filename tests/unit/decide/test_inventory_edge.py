"""Inventory at its edge: bad heartbeats are refused, one node's bad data costs only
that node, and a stall on inventory's own side does not lose the whole cluster."""

from __future__ import annotations

from datetime import datetime, timedelta

import orjson
import pytest

from gpuloom.decide.inventory import (
    Heard,
    LossLimit,
    decide_inventory,
    inventory_round,
    watch_start,
)
from gpuloom.events import Decision, NodeLost
from gpuloom.events.heartbeats import BadHeartbeat, Heartbeat
from gpuloom.testing.builders import T0, LogBuilder, make_node_spec

NOW = T0 + timedelta(hours=1)
TIMEOUT = timedelta(seconds=10)
LONG_AGO = NOW - timedelta(hours=1)


def heard(name: str, seconds_ago: float) -> Heard:
    return Heard(at=NOW - timedelta(seconds=seconds_ago), spec=make_node_spec(name))


def cluster(*names: str) -> LogBuilder:
    log = LogBuilder()
    for name in names:
        log.register(name, 4)
    return log


def lost(decisions: list[Decision]) -> list[str]:
    return [d.event.node for d in decisions if isinstance(d.event, NodeLost)]


# --- heartbeats at the edge ------------------------------------------------------------


def beat_body(node: str) -> bytes:
    """What an agent would send for `node`, bypassing the model's own check."""
    return orjson.dumps({"node": node, "spec": make_node_spec("n1").model_dump(mode="json")})


def test_a_heartbeat_on_its_own_subject_is_received() -> None:
    beat = Heartbeat.received(
        "gpuloom.hb.n1", Heartbeat(node="n1", spec=make_node_spec("n1")).encode()
    )
    assert beat.node == "n1"


@pytest.mark.parametrize(
    ("subject", "body", "why"),
    [
        ("gpuloom.hb.bad", beat_body("bad.node"), "node: String should match pattern"),
        ("gpuloom.hb.x", beat_body("x y"), "node: String should match pattern"),
        ("gpuloom.hb.n2", beat_body("n1"), "'n1' heartbeats on the subject of 'n2'"),
        ("gpuloom.hb.n1", b"\x00\xffnot json", "not a heartbeat"),
        ("gpuloom.hb.n1", b'{"node": "n1"}', "spec: Field required"),
    ],
    ids=[
        "a node name with a dot is refused",
        "a node name with a blank is refused",
        "a node speaking on another node's subject is refused",
        "bytes that are not JSON are refused",
        "a heartbeat without a spec is refused",
    ],
)
def test_a_bad_heartbeat_is_refused_with_a_reason(subject: str, body: bytes, why: str) -> None:
    with pytest.raises(BadHeartbeat, match=why):
        Heartbeat.received(subject, body)


# --- containment -----------------------------------------------------------------------


def test_one_node_whose_name_cannot_be_an_event_does_not_stop_the_others() -> None:
    log = cluster("n1")
    beats = {"bad.node": heard("bad.node", 1), "n2": heard("n2", 1)}
    result = inventory_round(log.state(), beats, NOW, TIMEOUT, LONG_AGO)
    assert [(type(d.event).__name__, d.event.aggregate_id()) for d in result.decisions] == [
        ("NodeRegistered", "n2"),
        ("NodeLost", "n1"),
    ]
    [(node, why)] = result.skipped
    assert node == "bad.node" and "ValidationError" in why


# --- the inventory's own stalls ---------------------------------------------------------


@pytest.mark.parametrize(
    ("previous_round", "listening", "restarts"),
    [
        (None, True, False),
        (NOW - timedelta(seconds=2), True, False),
        (NOW - timedelta(seconds=6), True, True),
        (NOW - timedelta(seconds=1), False, True),
    ],
    ids=[
        "the first round keeps the watch that began at start-up",
        "rounds a quarter timeout apart keep the watch",
        "a gap over half the timeout restarts the watch",
        "a round without a NATS connection restarts the watch",
    ],
)
def test_the_watch_restarts_when_inventory_was_not_listening(
    previous_round: datetime | None, listening: bool, restarts: bool
) -> None:
    since = NOW - timedelta(minutes=5)
    got = watch_start(since, previous_round, NOW, TIMEOUT, listening=listening)
    assert got == (NOW if restarts else since)


def test_after_inventory_was_paused_no_node_is_lost() -> None:
    log = cluster("n1", "n2", "n3")
    beats = {name: heard(name, 30) for name in ("n1", "n2", "n3")}  # heard before the pause
    since = watch_start(LONG_AGO, NOW - timedelta(seconds=30), NOW, TIMEOUT)
    assert decide_inventory(log.state(), beats, NOW, TIMEOUT, since) == []


# --- many silent nodes at once ----------------------------------------------------------


def test_a_single_silent_node_among_many_is_lost_on_time() -> None:
    log = cluster("n1", "n2", "n3", "n4")
    beats = {"n1": heard("n1", 11), **{n: heard(n, 1) for n in ("n2", "n3", "n4")}}
    assert lost(decide_inventory(log.state(), beats, NOW, TIMEOUT, LONG_AGO)) == ["n1"]


def test_half_of_the_ready_nodes_silent_are_lost_on_time() -> None:
    log = cluster("n1", "n2", "n3", "n4")
    beats = {
        "n1": heard("n1", 11),
        "n2": heard("n2", 11),
        "n3": heard("n3", 1),
        "n4": heard("n4", 1),
    }
    assert lost(decide_inventory(log.state(), beats, NOW, TIMEOUT, LONG_AGO)) == ["n1", "n2"]


def test_most_nodes_silent_for_less_than_twice_the_timeout_are_not_lost() -> None:
    log = cluster("n1", "n2", "n3")
    beats = {"n1": heard("n1", 15), "n2": heard("n2", 19), "n3": heard("n3", 1)}
    assert decide_inventory(log.state(), beats, NOW, TIMEOUT, LONG_AGO) == []


def test_in_a_mass_silence_one_node_per_timeout_is_lost_the_longest_silent_first() -> None:
    log = cluster("n1", "n2", "n3", "n4")
    beats = {
        "n1": heard("n1", 25),
        "n2": heard("n2", 40),
        "n3": heard("n3", 30),
        "n4": heard("n4", 1),
    }
    assert lost(decide_inventory(log.state(), beats, NOW, TIMEOUT, LONG_AGO)) == ["n2"]

    log.lose("n2", at=NOW - timedelta(seconds=9))
    assert decide_inventory(log.state(), beats, NOW, TIMEOUT, LONG_AGO) == []

    later = NOW + timedelta(seconds=2)  # n2 was lost 11 s ago: the next one may go
    assert lost(decide_inventory(log.state(), beats, later, TIMEOUT, LONG_AGO)) == ["n3"]


def test_the_losses_per_timeout_and_the_fraction_are_settings() -> None:
    log = cluster("n1", "n2", "n3")
    beats = {name: heard(name, 25) for name in ("n1", "n2", "n3")}
    two = LossLimit(per_timeout=2)
    assert lost(decide_inventory(log.state(), beats, NOW, TIMEOUT, LONG_AGO, two)) == ["n1", "n2"]
    off = LossLimit(max_fraction=1.0)
    short = {name: heard(name, 11) for name in ("n1", "n2", "n3")}
    assert lost(decide_inventory(log.state(), short, NOW, TIMEOUT, LONG_AGO, off)) == [
        "n1",
        "n2",
        "n3",
    ]

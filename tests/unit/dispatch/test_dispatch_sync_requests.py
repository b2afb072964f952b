"""The dispatcher reads an agent's sync request (`gpuloom.dispatch.sync.<node>`,
`{"seq": n}`) and refuses one it cannot read without stopping or logging each: it
counts them (`gpuloom_dispatch_syncs_refused_total`), so that a flood shows on a
dashboard rather than on the disk."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpuloom.bus import EventBus
from gpuloom.bus.messages import Received
from gpuloom.telemetry.metrics import SYNCS_REFUSED
from services.dispatch.__main__ import Dispatcher


def dispatcher() -> Dispatcher:
    nc: Any = SimpleNamespace(jetstream=lambda: None)  # no request here reaches the bus
    return Dispatcher(EventBus(nc, "GPULOOM"))


def sync(node: str, body: bytes) -> Received:
    return Received(f"gpuloom.dispatch.sync.{node}", body)


def test_a_sync_request_asks_for_the_highest_sequence_of_its_node() -> None:
    dispatch = dispatcher()
    dispatch.on_sync(sync("node-a", b'{"seq": 7}'))
    dispatch.on_sync(sync("node-a", b'{"seq": 5}'))
    assert dispatch.asked == {"node-a": 7}


def test_an_unreadable_request_is_counted_and_changes_nothing() -> None:
    dispatch = dispatcher()
    before = SYNCS_REFUSED._value.get()
    for node, body in [
        ("node-a", b"not json"),
        ("node-a", b'{"seq": -1}'),
        ("node-a", b'{"seq": true}'),
        ("node-a", b'{"at": 3}'),
        ("node>", b'{"seq": 3}'),
    ]:
        dispatch.on_sync(sync(node, body))
    assert dispatch.asked == {}
    assert dispatch.refused_syncs == 5
    assert SYNCS_REFUSED._value.get() - before == 5

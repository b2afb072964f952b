"""The webhooks process's own pieces, without a server: WebhookDisabled written under
its own name with an intent key (once per webhook), and its fold's `wait_for`."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

from gpuloom.bus import Outgoing
from gpuloom.bus.identities import WRITERS, event_permission, subject_matches_pattern
from gpuloom.events import WebhookDisabled, WebhookRegistered, decode, make_envelope
from gpuloom.events.codec import Recorded
from gpuloom.state import ClusterState, apply
from services.webhooks.disable import disabler
from services.webhooks.fold import Fold

AT = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
URL = "https://receiver.example.org/hook/s3cret?token=s3cret"


class FakeBus:
    """Takes publishes; `fail` makes the next ones time out (the log is away)."""

    def __init__(self) -> None:
        self.sent: list[Outgoing] = []
        self.fail = False

    async def publish(self, message: Outgoing, timeout: float = 5.0) -> tuple[int, bool]:
        if self.fail:
            raise TimeoutError("nats: timeout")
        self.sent.append(message)
        return len(self.sent), False

    def dead_letters(self, service: str) -> Any:
        return None


def state_with(*hooks: str) -> ClusterState:
    state = ClusterState()
    for seq, hook_id in enumerate(hooks, start=1):
        event = WebhookRegistered(
            webhook_id=hook_id, owner="alice", url=URL, secret_sealed="v1.a.b"
        )
        apply(state, Recorded(seq, make_envelope(event, at=AT, by="gateway"), event))
    return state


def test_a_disable_is_webhook_disabled_by_webhooks_with_its_intent_key() -> None:
    state, bus = state_with("h1", "h2"), FakeBus()
    disable = disabler(bus, lambda: state, 1.0)  # type: ignore[arg-type]
    asyncio.run(disable("h1", "the receiver answered 410 Gone"))
    [message] = bus.sent
    assert WRITERS["WebhookDisabled"] == ("webhook", "webhooks")
    assert subject_matches_pattern(event_permission("WebhookDisabled"), message.subject)
    assert message.headers["Nats-Msg-Id"] == "h1:disabled"  # two replicas: one event
    recorded = decode(1, message.body, AT, subject=message.subject)
    assert recorded.envelope.by == "webhooks"
    assert recorded.event == WebhookDisabled(
        webhook_id="h1", reason="the receiver answered 410 Gone"
    )


def test_an_unknown_or_disabled_webhook_is_not_disabled_again_and_a_failure_is_no_crash(
    caplog: Any,
) -> None:
    state, bus = state_with("h1"), FakeBus()
    disable = disabler(bus, lambda: state, 1.0)  # type: ignore[arg-type]
    asyncio.run(disable("nope", "gone"))
    live = state.webhooks["h1"]
    state.webhooks["h1"] = replace(live, disabled="earlier")
    asyncio.run(disable("h1", "gone"))
    assert bus.sent == []
    state.webhooks["h1"] = live
    bus.fail = True
    asyncio.run(disable("h1", "gone"))  # the log is away: logged, asked again later
    assert bus.sent == [] and "could not disable h1" in caplog.text
    assert "s3cret" not in caplog.text and "/hook" not in caplog.text


def test_the_fold_answers_wait_for_once_it_holds_the_sequence() -> None:
    async def scenario() -> tuple[bool, bool, bool]:
        fold = Fold(FakeBus())  # type: ignore[arg-type]
        fold.follower.state = state_with("h1", "h2")  # folded up to seq 2
        held = await fold.wait_for(2, timeout=0.05)
        early = await fold.wait_for(3, timeout=0.05)
        waiting = asyncio.create_task(fold.wait_for(3, timeout=5))
        await asyncio.sleep(0.01)
        fold.follower.state.seq = 3
        async with fold.changed:
            fold.changed.notify_all()
        return held, early, await waiting

    assert asyncio.run(scenario()) == (True, False, True)

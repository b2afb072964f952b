"""Composition root of the node-inventory service.

Heartbeats arrive as core NATS messages; the service remembers when it last
heard each node (wall clock, at the edge) and lets the pure `inventory_round`
turn that into log events on every tick. Anyone on the bus can publish a
heartbeat, so a bad one is refused here (logged at most once a minute per
subject, and dead-lettered) and never reaches the decision.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpuloom.bus import DeadLetter, EventBus
from gpuloom.bus.messages import Received
from gpuloom.config import Settings
from gpuloom.decide.inventory import Heard, LossLimit, inventory_round, watch_start
from gpuloom.events import Decision
from gpuloom.events.heartbeats import BadHeartbeat, Heartbeat
from gpuloom.events.subjects import HEARTBEAT_PREFIX
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.runtime.service import run_service, snapshotter
from gpuloom.state import ClusterState

log = logging.getLogger(__name__)

#: A refused heartbeat, or a skipped node, is reported once per this many seconds.
REPORT_EVERY_S = 60.0


class Throttle:
    """Whether to report about `key` now: once per `period_s`, for a bounded set of keys."""

    def __init__(self, period_s: float, max_keys: int = 1024) -> None:
        self.period_s = period_s
        self.max_keys = max_keys
        self._last: dict[str, float] = {}

    def allow(self, key: str, now: float) -> bool:
        last = self._last.get(key)
        if last is not None and now - last < self.period_s:
            return False
        if len(self._last) >= self.max_keys:  # a flood of new subjects: start over
            self._last.clear()
        self._last[key] = now
        return True


@dataclass
class Watch:
    """When the current uninterrupted watch began and when the last round ran."""

    since: datetime
    previous_round: datetime | None = None


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    heard: dict[str, Heard] = {}
    timeout = timedelta(seconds=settings.node_lost_timeout_s)
    limit = LossLimit(settings.node_loss_max_fraction, settings.node_loss_max_per_timeout)
    watch = Watch(since=datetime.now(UTC))
    dead_letters = bus.dead_letters("inventory")
    reports = Throttle(REPORT_EVERY_S)

    async def on_heartbeat(msg: Received) -> None:
        try:
            beat = Heartbeat.received(msg.subject, msg.data)
        except BadHeartbeat as exc:
            if reports.allow(msg.subject, time.monotonic()):
                log.warning("refused heartbeat on %r: %s", msg.subject, exc)
                dead_letters.put(
                    DeadLetter(
                        service="inventory",
                        source="heartbeat",
                        subject=msg.subject,
                        reason_kind="heartbeat",
                        reason=str(exc),
                        body=msg.data,
                        at=datetime.now(UTC),
                    )
                )
            return
        heard[beat.node] = Heard(at=datetime.now(UTC), spec=beat.spec)

    unserve = await bus.serve(f"{HEARTBEAT_PREFIX}.*", on_heartbeat)

    def decide(state: ClusterState) -> list[Decision]:
        now = datetime.now(UTC)
        watch.since = watch_start(
            watch.since, watch.previous_round, now, timeout, listening=bus.connected
        )
        watch.previous_round = now
        result = inventory_round(state, heard, now, timeout, watch.since, limit)
        for node, why in result.skipped:
            if reports.allow(f"skipped:{node}", time.monotonic()):
                log.error("inventory skipped node %r this round: %s", node, why)
        return result.decisions

    tick = min(settings.heartbeat_interval_s, settings.node_lost_timeout_s / 4)
    try:
        await Reactor(
            bus,
            "inventory",
            pure(decide),
            tick_s=tick,
            snapshots=snapshotter(settings, bus, "inventory"),
        ).run(stop)
    finally:
        await unserve()


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("inventory", main)


if __name__ == "__main__":
    entrypoint()

"""Composition root of the node-inventory service.

Heartbeats arrive as core NATS messages; the service remembers when it last
heard each node (wall clock, at the edge) and lets the pure
`decide_inventory` turn that into log events on every tick.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from nats.aio.msg import Msg
from pydantic import ValidationError

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.decide.inventory import Heard, decide_inventory
from gpuloom.events.heartbeats import Heartbeat
from gpuloom.events.subjects import HEARTBEAT_PREFIX
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.runtime.service import run_service
from gpuloom.state import ClusterState

log = logging.getLogger(__name__)


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    heard: dict[str, Heard] = {}
    timeout = timedelta(seconds=settings.node_lost_timeout_s)
    watching_since = datetime.now(UTC)

    async def on_heartbeat(msg: Msg) -> None:
        try:
            beat = Heartbeat.model_validate_json(msg.data)
        except ValidationError as exc:
            log.error("skipping malformed heartbeat on %s: %s", msg.subject, exc)
            return
        heard[beat.node] = Heard(at=datetime.now(UTC), spec=beat.spec)

    sub = await bus.nc.subscribe(f"{HEARTBEAT_PREFIX}.*", cb=on_heartbeat)

    def decide(state: ClusterState):  # type: ignore[no-untyped-def]
        return decide_inventory(state, heard, datetime.now(UTC), timeout, watching_since)

    tick = min(settings.heartbeat_interval_s, settings.node_lost_timeout_s / 4)
    try:
        await Reactor(bus, "inventory", pure(decide), tick_s=tick).run(stop)
    finally:
        await sub.unsubscribe()


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("inventory", main)


if __name__ == "__main__":
    entrypoint()

"""Composition root of the placement service."""

from __future__ import annotations

import asyncio
import logging

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.placement import default_registry, placement_cycle
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.runtime.service import run_service
from gpuloom.state import ClusterState

log = logging.getLogger(__name__)


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    policy = default_registry().get(settings.placement_policy)
    log.info("placement policy %s v%d", policy.name, policy.version)

    def decide(state: ClusterState):  # type: ignore[no-untyped-def]
        return placement_cycle(state, policy)

    await Reactor(bus, "placement", pure(decide)).run(stop)


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("placement", main)


if __name__ == "__main__":
    entrypoint()

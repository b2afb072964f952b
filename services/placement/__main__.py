"""Composition root of the placement service."""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import UTC, datetime

from gpuloom.bus import EventBus
from gpuloom.config import Settings, load_settings
from gpuloom.decide.reservations import decide_reservation_times
from gpuloom.placement import IndexCache, default_registry, placement_cycle
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.runtime.service import run_service, snapshotter
from gpuloom.state import ClusterState
from gpuloom.state.changes import ChangeFeed

log = logging.getLogger(__name__)

#: How often placement looks at the clock for reservations that start or end (s).
TICK_S = 1.0


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    policy = default_registry().get(settings.placement_policy)
    log.info("placement policy %s v%d", policy.name, policy.version)
    changes = ChangeFeed()  # fed by the reactor's fold: what the kept index re-reads
    kept = IndexCache(changes)

    idle_at = -1  # the state's seq when a cycle last found nothing to do

    def decide(state: ClusterState):  # type: ignore[no-untyped-def]
        nonlocal idle_at
        # the clock is read here, in the shell: a reservation's start and end are
        # written when they come, so that the log's time passes them (decide.reservations)
        due = decide_reservation_times(state, datetime.now(UTC))
        if due:
            return due
        if state.seq == idle_at:  # a tick with nothing new: the pure cycle finds the same
            return []
        decisions = placement_cycle(state, policy, kept=kept)
        idle_at = -1 if decisions else state.seq
        return decisions

    await Reactor(
        bus,
        "placement",
        pure(decide),
        tick_s=TICK_S,
        observers=[changes],
        snapshots=snapshotter(settings, bus, "placement"),
    ).run(stop)


def entrypoint(argv: list[str] | None = None) -> None:
    name = load_settings().placement_policy
    try:
        default_registry().get(name)
    except KeyError as exc:  # a configuration error: say so plainly, exit 2
        print(f"placement: GPULOOM_PLACEMENT_POLICY: {exc.args[0]}", file=sys.stderr)
        raise SystemExit(2) from None
    run_service("placement", main)


if __name__ == "__main__":
    entrypoint()

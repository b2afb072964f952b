"""Composition root of the admission service."""

from __future__ import annotations

import asyncio

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.decide.admission import decide_admission
from gpuloom.events import Decision
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.runtime.service import run_service, snapshotter
from gpuloom.state import ClusterState


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    limit = settings.max_time_limit_s or None

    def decide(state: ClusterState) -> list[Decision]:
        return decide_admission(state, limit)

    await Reactor(
        bus, "admission", pure(decide), snapshots=snapshotter(settings, bus, "admission")
    ).run(stop)


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("admission", main)


if __name__ == "__main__":
    entrypoint()

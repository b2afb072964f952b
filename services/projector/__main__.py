"""Composition root of the read-model writer: fold the log, keep the SQL rows in step.

The gateway answers reads from these rows; it no longer writes them on the loop that
answers requests, where one user's 10,000-task array (30,000 row writes) held every
other user's reads up. This process runs `gpuloom.runtime.projector`
with its own bus identity (it reads the log and writes nothing on it but its dead
letters) and its own snapshots; the gateway learns how far it has written from the
checkpoint it keeps with the rows (`services.gateway.readmodel`).

Two copies may run: their rows are upserts of the same fold, their checkpoints move
forward only.
"""

from __future__ import annotations

import asyncio

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.runtime.projector import Projector
from gpuloom.runtime.service import run_service, snapshotter
from gpuloom.store.session import make_engine, make_sessionmaker


async def serve(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    engine = make_engine(settings.database_url)
    try:
        projector = Projector(
            bus, make_sessionmaker(engine), snapshots=snapshotter(settings, bus, "projector")
        )
        await projector.run(stop)
    finally:
        await engine.dispose()


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("projector", serve)


if __name__ == "__main__":
    entrypoint()

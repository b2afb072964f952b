"""Composition root of the accounting service: the charging reactor and the SQL ledger
it keeps from its fold."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime, timedelta

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.decide.accounting import decide_charges
from gpuloom.events import Decision
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.runtime.service import run_service, snapshotter
from gpuloom.state import ClusterState
from gpuloom.store.session import make_engine, make_sessionmaker
from services.accounting.ledger import RETIRED_DURABLE, Ledger

log = logging.getLogger(__name__)


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    engine = make_engine(settings.database_url)
    interval = timedelta(seconds=settings.charge_interval_s) if settings.charge_interval_s else None

    def decide(state: ClusterState) -> list[Decision]:
        # the clock is read here, in the shell; the charge records it (period_end)
        return decide_charges(state, datetime.now(UTC), interval)

    tick = min(settings.charge_interval_s / 2, 30.0) if interval else None
    if await bus.drop_durable(RETIRED_DURABLE):
        log.info("deleted the consumer %s of an older version", RETIRED_DURABLE)
    try:
        await Reactor(
            bus,
            "accounting",
            pure(decide),
            tick_s=tick,
            projections=[Ledger(make_sessionmaker(engine))],
            snapshots=snapshotter(settings, bus, "accounting"),
        ).run(stop)
    finally:
        await engine.dispose()


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("accounting", main)


if __name__ == "__main__":
    entrypoint()

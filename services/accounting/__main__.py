"""Composition root of the accounting service: the charging reactor and the SQL ledger."""

from __future__ import annotations

import asyncio

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.decide.accounting import decide_charges
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.runtime.service import run_service
from gpuloom.store.session import make_engine, make_sessionmaker
from services.accounting.ledger import run_ledger


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    engine = make_engine(settings.database_url)
    try:
        await asyncio.gather(
            Reactor(bus, "accounting", pure(decide_charges)).run(stop),
            run_ledger(bus, make_sessionmaker(engine), stop),
        )
    finally:
        await engine.dispose()


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("accounting", main)


if __name__ == "__main__":
    entrypoint()

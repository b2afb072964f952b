"""The usage ledger resumes from its SQL checkpoint, which is the truth about its
position: a durable consumer that acked charges the ledger lost (its tables restored
from an older backup) is made again from the checkpoint, and the charges come back."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest
from projection_helpers import put, submit
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus import EventBus
from gpuloom.events import UsageCharged
from gpuloom.store.models import ProjectionCheckpoint, UsageChargeRow, UsageModelChargeRow
from services.accounting import ledger

pytestmark = pytest.mark.integration


def charge(job_id: str) -> UsageCharged:
    return UsageCharged(
        job_id=job_id, attempt=1, user="u", account="a", gpus=1, seconds=1.0,
        gpu_milli_seconds=1000, by_model={"A100-80GB": 1000},
    )  # fmt: skip


async def run_until(bus: EventBus, sessions: async_sessionmaker[Any], settled: Any) -> None:
    """Run the ledger until `settled()` holds, then stop it as a clean stop does."""
    stop = asyncio.Event()
    task = asyncio.create_task(ledger.run_ledger(bus, sessions, stop))
    try:
        deadline = asyncio.get_running_loop().time() + 15
        while not await settled():
            assert not task.done(), task.exception()
            assert asyncio.get_running_loop().time() < deadline, "the ledger did not settle"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task


async def charged(sessions: async_sessionmaker[Any]) -> list[str]:
    async with sessions() as session:
        return sorted(await session.scalars(select(UsageChargeRow.job_id)))


async def test_a_ledger_that_lost_acked_charges_rebuilds_them(
    sessions: async_sessionmaker[Any], bus: EventBus, caplog: pytest.LogCaptureFixture
) -> None:
    first = await put(bus, charge("c-1"))
    await put(bus, submit("other"))
    last = await put(bus, charge("c-2"))

    async def all_charged() -> bool:
        return await charged(sessions) == ["c-1", "c-2"]

    await run_until(bus, sessions, all_charged)
    async with sessions() as session, session.begin():  # restored from an older backup
        for table in (UsageChargeRow, UsageModelChargeRow):
            await session.execute(delete(table).where(table.job_id == "c-2"))
        checkpoint = await session.get(ProjectionCheckpoint, ledger.CHECKPOINT)
        assert checkpoint is not None
        checkpoint.last_seq = first

    with caplog.at_level(logging.WARNING, logger=ledger.__name__):
        await run_until(bus, sessions, all_charged)
    assert f"ledger checkpoint {first} is behind the consumer (ack floor {last})" in caplog.text

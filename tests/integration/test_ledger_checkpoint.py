"""The usage ledger is a projection of accounting's fold: it writes only the charges the
fold applied, and its SQL checkpoint is the truth about its position (a ledger whose
tables lost charges, restored from an older backup, gets them back from the log, even
past a newer snapshot)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from projection_helpers import accounting_ledger, charged_runs, near_now, put_records
from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus import EventBus
from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.events import UsageCharged
from gpuloom.runtime.snapshots import SnapshotPolicy, Snapshotter
from gpuloom.store.models import ProjectionCheckpoint, UsageChargeRow, UsageModelChargeRow
from gpuloom.store.upsert import load_checkpoint
from services.accounting import ledger

pytestmark = pytest.mark.integration


async def run_until(
    bus: EventBus,
    sessions: async_sessionmaker[Any],
    settled: Any,
    snapshots: Snapshotter | None = None,
) -> None:
    """Run accounting's reactor and ledger until `settled()` holds, then stop it cleanly."""
    stop = asyncio.Event()
    reactor = accounting_ledger(bus, sessions, snapshots=snapshots)
    task = asyncio.create_task(reactor.run(stop))
    try:
        deadline = asyncio.get_running_loop().time() + 15
        while not await settled():
            assert not task.done(), task.exception()
            assert asyncio.get_running_loop().time() < deadline, "the ledger did not settle"
            await asyncio.sleep(0.05)
    finally:
        stop.set()
        await task


async def charged(sessions: async_sessionmaker[Any]) -> list[tuple[str, int]]:
    async with sessions() as session:
        rows = await session.execute(select(UsageChargeRow.job_id, UsageChargeRow.seq))
        return sorted((job_id, seq) for job_id, seq in rows.all())


async def checkpoint_at(sessions: async_sessionmaker[Any], seq: int) -> bool:
    async with sessions() as session:
        return await load_checkpoint(session, ledger.CHECKPOINT) >= seq


async def test_the_ledger_writes_only_the_charges_the_fold_applied(
    sessions: async_sessionmaker[Any], bus: EventBus
) -> None:
    log = near_now()
    charges = charged_runs(log, "c-1")
    log.charge("c-1", seconds=60)  # the same attempt again: voided
    log.append(  # a run that never was: voided
        UsageCharged(
            job_id="ghost", attempt=1, user="u", account="a", gpus=1, seconds=1.0,
            gpu_milli_seconds=1000,
        )
    )  # fmt: skip
    seqs = await put_records(bus, log.records)

    async def settled() -> bool:
        return await checkpoint_at(sessions, seqs[-1])

    await run_until(bus, sessions, settled)
    assert await charged(sessions) == [("c-1", seqs[charges["c-1"].seq - 1])]


async def test_a_ledger_that_lost_charges_rebuilds_them_past_a_newer_snapshot(
    sessions: async_sessionmaker[Any], bus: EventBus
) -> None:
    log = near_now()
    charges = charged_runs(log, "c-1", "c-2")
    seqs = await put_records(bus, log.records)
    first, last = seqs[charges["c-1"].seq - 1], seqs[-1]
    store = SnapshotStore(bus.js, "accounting", create=True)

    async def all_charged() -> bool:
        return [job for job, _ in await charged(sessions)] == ["c-1", "c-2"]

    async def written() -> bool:
        return await all_charged() and await checkpoint_at(sessions, last)

    await run_until(bus, sessions, written, Snapshotter(store, SnapshotPolicy()))
    assert [s.seq for s in await store.stored()] == [last]  # the clean stop's snapshot
    async with sessions() as session, session.begin():  # restored from an older backup
        for table in (UsageChargeRow, UsageModelChargeRow):
            await session.execute(delete(table).where(table.job_id == "c-2"))
        checkpoint = await session.get(ProjectionCheckpoint, ledger.CHECKPOINT)
        assert checkpoint is not None
        checkpoint.last_seq = first

    await run_until(bus, sessions, all_charged, Snapshotter(store, SnapshotPolicy()))
    assert await charged(sessions) == [("c-1", first), ("c-2", last)]

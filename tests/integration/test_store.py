"""Projection storage contract, run on SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import select

from gpuloom.store.migrate import downgrade, upgrade
from gpuloom.store.models import JobRow, UsageChargeRow
from gpuloom.store.session import make_engine, make_sessionmaker
from gpuloom.store.upsert import insert_ignore, load_checkpoint, save_checkpoint, upsert_newer

pytestmark = pytest.mark.integration

AT = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)


def job(job_id: str, state: str, last_seq: int) -> dict[str, object]:
    return {
        "id": job_id, "name": "n", "user": "u", "account": "a", "state": state, "reason": None,
        "node": None, "gpus": [], "gpus_requested": 1, "gpu_model": [], "priority": 0,
        "command": ["true"], "time_limit_s": None, "attempt": 0, "cancel_requested": False,
        "exit_code": None, "idempotency_key": None, "submit_seq": 1, "submitted_at": AT,
        "started_at": None, "finished_at": None, "last_seq": last_seq,
    }  # fmt: skip


async def test_upsert_keeps_the_newest_row_and_checkpoints_only_move_forward(
    database_url: str,
) -> None:
    await upgrade(database_url)
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    try:
        async with sessions.begin() as session:
            await upsert_newer(session, JobRow, [job("j1", "queued", 5)], ["id"])
            await save_checkpoint(session, "p", 5)
        async with sessions.begin() as session:
            await upsert_newer(session, JobRow, [job("j1", "submitted", 3)], ["id"])  # older
            await save_checkpoint(session, "p", 3)
        async with sessions() as session:
            row = await session.get(JobRow, "j1")
            assert row is not None and row.state == "queued"
            assert row.submitted_at == AT and row.submitted_at.tzinfo is not None
            assert await load_checkpoint(session, "p") == 5
        async with sessions.begin() as session:
            await upsert_newer(session, JobRow, [job("j1", "running", 9)], ["id"])
        async with sessions() as session:
            assert (await session.get(JobRow, "j1")).state == "running"  # type: ignore[union-attr]
    finally:
        await engine.dispose()


async def test_the_ledger_ignores_a_repeated_charge(database_url: str) -> None:
    await upgrade(database_url)
    engine = make_engine(database_url)
    sessions = make_sessionmaker(engine)
    charge = {
        "job_id": "j1", "attempt": 1, "user": "u", "account": "a", "gpus": 2,
        "seconds": 1.5, "gpu_milli_seconds": 3000, "charged_at": AT, "seq": 7,
    }  # fmt: skip
    try:
        for _ in range(2):
            async with sessions.begin() as session:
                await insert_ignore(
                    session, UsageChargeRow, [charge], ["job_id", "attempt", "part"]
                )
        async with sessions() as session:
            rows = (await session.scalars(select(UsageChargeRow))).all()
            assert [(r.job_id, r.gpu_milli_seconds) for r in rows] == [("j1", 3000)]
    finally:
        await engine.dispose()


async def test_migrations_go_down_and_up_again(database_url: str) -> None:
    await upgrade(database_url)
    await downgrade(database_url, "base")
    await upgrade(database_url)

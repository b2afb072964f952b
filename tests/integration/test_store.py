"""Projection storage contract, run on SQLite and (when configured) PostgreSQL."""

from __future__ import annotations

from datetime import UTC, datetime
from pprint import pformat
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, select

from gpuloom.store.migrate import downgrade, upgrade
from gpuloom.store.models import Base, JobRow, UsageChargeRow
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
            assert (await session.get(JobRow, "j1")).state == "running"
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


async def table_names(url: str) -> set[str]:
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return set(await conn.run_sync(lambda sync: inspect(sync).get_table_names()))
    finally:
        await engine.dispose()


async def schema_differences(url: str) -> list[Any]:
    """What alembic's autogenerate would add to make the database at `url` match the models.

    `compare_type=True` as in migrations/env.py. Server defaults are not compared (alembic's
    default, and env.py's): 0002 gives `nodes.lends_remote_vgpu` and `nodes.isolation` server
    defaults only so that rows from before them get a value; the models give the same values
    as client-side defaults, which every insert through them sets. No other kind of difference
    is left out: on both SQLite and PostgreSQL the migrated schema matches the models exactly.
    """
    engine = make_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(
                lambda sync: compare_metadata(
                    MigrationContext.configure(sync, opts={"compare_type": True}), Base.metadata
                )
            )
    finally:
        await engine.dispose()


async def test_migrations_go_down_and_up_again(database_url: str) -> None:
    """Down to base drops every table the migrations made; back up to head, the schema
    is the models' (tables, columns, types, nullability, indexes, constraints)."""
    await upgrade(database_url)
    await downgrade(database_url, "base")
    assert await table_names(database_url) <= {"alembic_version"}
    await upgrade(database_url)
    assert await table_names(database_url) == set(Base.metadata.tables) | {"alembic_version"}
    differences = await schema_differences(database_url)
    assert not differences, "the migrations and libs/gpuloom/store/models.py differ:\n" + (
        "\n".join(pformat(difference) for difference in differences)
    )


async def test_inline_reads_see_the_rows_a_writer_commits_and_never_write(
    tmp_path: Any,
) -> None:
    """The gateway's SQLite reads (`gpuloom.store.inline`): what another connection has
    committed, rows usable after the session ends, and a write refused (query_only)."""
    from sqlalchemy import func, update
    from sqlalchemy.exc import OperationalError

    from gpuloom.store.inline import inline_reads

    url = f"sqlite+aiosqlite:///{tmp_path}/db.sqlite"
    await upgrade(url)
    engine = make_engine(url)
    writes = make_sessionmaker(engine)
    reads = inline_reads(url)
    assert reads is not None
    try:
        async with writes.begin() as session:
            await upsert_newer(session, JobRow, [job("j1", "queued", 5)], ["id"])
        async with reads() as session:
            row = await session.get(JobRow, "j1")
            count = await session.scalar(select(func.count()).select_from(JobRow))
            listed = list(await session.scalars(select(JobRow)))
            pairs = (await session.execute(select(JobRow.id, JobRow.state))).all()
        assert row is not None and row.state == "queued" and row.submitted_at == AT
        assert count == 1 and [r.id for r in listed] == ["j1"] and pairs == [("j1", "queued")]
        async with writes.begin() as session:  # the writer moves on; the next read sees it
            await upsert_newer(session, JobRow, [job("j1", "running", 9)], ["id"])
        async with reads() as session:
            assert (await session.get(JobRow, "j1")).state == "running"
            with pytest.raises(OperationalError, match="readonly"):
                await session.execute(update(JobRow).values(state="failed"))
    finally:
        await engine.dispose()


def test_inline_reads_are_for_a_sqlite_file_only() -> None:
    from gpuloom.store.inline import inline_reads

    assert inline_reads("postgresql+asyncpg://u@127.0.0.1/test") is None
    assert inline_reads("sqlite+aiosqlite:///:memory:") is None

"""Projections that cannot freeze: a row the database refuses is quarantined, the rest
goes on. Real NATS, real SQLite and PostgreSQL; events go straight onto the log.

The refusal is the database's own (a NUL in a string on PostgreSQL, an integer
over 2^63 on SQLite), produced by a row mapper handed to the projection, so that
the tests do not depend on what the event contract lets through.
"""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from projection_helpers import (
    Refusing,
    accounting_ledger,
    charged_runs,
    near_now,
    put,
    put_records,
    refused_value,
    submit,
    until,
)
from sqlalchemy import inspect, select
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus import EventBus
from gpuloom.events import JobAdmitted, JobArraySubmitted, UsageCharged
from gpuloom.runtime.projector import CHECKPOINT, ROWS_PER_WRITE, Projector
from gpuloom.store import rows
from gpuloom.store.migrate import downgrade, upgrade
from gpuloom.store.models import Base, JobRow, ProjectionQuarantine, UsageChargeRow
from gpuloom.store.quarantine import Item, is_data_error, upsert_items, write_batch
from gpuloom.store.session import make_engine, make_sessionmaker
from gpuloom.store.upsert import load_checkpoint, upsert_newer, upsert_on_key
from gpuloom.testing.builders import LogBuilder, make_job_spec
from services.accounting import ledger

pytestmark = pytest.mark.integration


async def quarantine(sessions: async_sessionmaker[Any]) -> dict[str, ProjectionQuarantine]:
    async with sessions() as session:
        found = await session.scalars(select(ProjectionQuarantine))
        return {entry.key: entry for entry in found}


async def job_ids(sessions: async_sessionmaker[Any]) -> list[str]:
    async with sessions() as session:
        return sorted(await session.scalars(select(JobRow.id)))


async def test_a_refused_job_row_is_quarantined_and_the_projection_goes_on(
    database_url: str, sessions: async_sessionmaker[Any], bus: EventBus
) -> None:
    mapper = Refusing(refused_value(database_url))
    stop = asyncio.Event()
    projector = Projector(bus, sessions, job_row=mapper)
    task = asyncio.create_task(projector.run(stop))
    try:
        first = await put(bus, submit("good-1"), submit("bad-forever"), submit("bad-once"))
        # a later batch must still be written: the projection is not frozen
        await until(lambda: projector.written_seq >= first)
        last = await put(bus, submit("good-2"))
        assert await projector.wait_for(last, 15)
        assert await job_ids(sessions) == ["good-1", "good-2"]
        entries = await quarantine(sessions)
        assert sorted(entries) == ["bad-forever", "bad-once"]
        bad = entries["bad-forever"]
        assert (bad.projection, bad.kind, bad.seq) == (CHECKPOINT, "job", 2)
        assert bad.error  # the driver's reason
        row = json.loads(bad.row)["jobs"]
        assert row["id"] == "bad-forever"
        if "name" in mapper.refused:
            assert row["name"] == "evil\\x00name"  # escaped, so the quarantine takes it
        assert projector.quarantined == 2
        async with sessions() as session:
            assert await load_checkpoint(session, CHECKPOINT) == last

        # a later event changes both: one goes in and leaves, the other is refused anew
        admitted = await put(bus, JobAdmitted(job_id="bad-once"), JobAdmitted(job_id="bad-forever"))
        assert await projector.wait_for(admitted, 15)
        assert await job_ids(sessions) == ["bad-once", "good-1", "good-2"]
        entries = await quarantine(sessions)
        assert sorted(entries) == ["bad-forever"]
        assert entries["bad-forever"].seq == admitted
        assert projector.quarantined == 1
        assert await projector.lag_behind_stream() == 0
    finally:
        stop.set()
        await task

    # a restart folds the log again but retries nothing: the checkpoint has moved on
    made_before = dict(mapper.made)
    stop = asyncio.Event()
    again = Projector(bus, sessions, job_row=mapper)
    task = asyncio.create_task(again.run(stop))
    try:
        await until(lambda: again.state.seq >= admitted)
        later = await put(bus, submit("good-3"))
        assert await again.wait_for(later, 15)
        await asyncio.sleep(1.2)  # more than one retry round of the old loop
        assert again.quarantined == 1
        assert mapper.made["bad-forever"] == made_before["bad-forever"]
        assert await job_ids(sessions) == ["bad-once", "good-1", "good-2", "good-3"]
        assert (await quarantine(sessions))["bad-forever"].seq == admitted
    finally:
        stop.set()
        await task


async def test_a_missing_table_is_retried_not_quarantined(
    database_url: str, sessions: async_sessionmaker[Any], bus: EventBus
) -> None:
    """The database being unable to write (here: the table is gone) is not the row's fault."""
    jobs = Base.metadata.tables["jobs"]
    stop = asyncio.Event()
    projector = Projector(bus, sessions)
    task = asyncio.create_task(projector.run(stop))
    try:
        first = await put(bus, submit("before"))
        assert await projector.wait_for(first, 15)
        async with sessions.begin() as session:
            await session.run_sync(lambda s: jobs.drop(s.connection()))
        later = await put(bus, submit("during"))
        assert not await projector.wait_for(later, 2.5)  # two retry rounds at least
        async with sessions() as session:
            assert await load_checkpoint(session, CHECKPOINT) == first
        assert await quarantine(sessions) == {}
        async with sessions.begin() as session:
            await session.run_sync(lambda s: jobs.create(s.connection()))
        assert await projector.wait_for(later, 15)
        assert await job_ids(sessions) == ["during"]  # "before" was written to the old table
        assert await quarantine(sessions) == {} and projector.quarantined == 0
    finally:
        stop.set()
        await task


async def test_a_refused_charge_is_quarantined_and_the_ledger_goes_on(
    database_url: str, sessions: async_sessionmaker[Any], bus: EventBus
) -> None:
    refused: dict[str, Any] = {"gpu_milli_seconds": 2**63}  # over SQLite's INTEGER
    if database_url.startswith("postgresql"):
        refused = {"user": "evil\x00user"}

    def charge_rows(seq: int, event: UsageCharged, at: datetime) -> list[Any]:
        made = ledger.charge_rows(seq, event, at)
        if event.job_id == "bad":
            made[0][1].update(refused)
        return made

    log = near_now()
    charges = charged_runs(log, "good-1", "bad", "good-2")
    seqs = await put_records(bus, log.records)
    last, bad_seq = seqs[-1], seqs[charges["bad"].seq - 1]
    stop = asyncio.Event()
    task = asyncio.create_task(accounting_ledger(bus, sessions, rows=charge_rows).run(stop))
    try:
        deadline = asyncio.get_running_loop().time() + 15
        while True:
            assert not task.done(), task.exception()
            async with sessions() as session:
                if await load_checkpoint(session, ledger.CHECKPOINT) >= last:
                    break
            assert asyncio.get_running_loop().time() < deadline, "the ledger froze"
            await asyncio.sleep(0.05)
        async with sessions() as session:
            charged = sorted(await session.scalars(select(UsageChargeRow.job_id)))
        assert charged == ["good-1", "good-2"]
        entries = await quarantine(sessions)
        assert list(entries) == ["bad/1/0"]
        entry = entries["bad/1/0"]
        assert (entry.projection, entry.kind, entry.seq) == (ledger.CHECKPOINT, "charge", bad_seq)
        assert set(json.loads(entry.row)) == {"usage_charges", "usage_model_charges"}
    finally:
        stop.set()
        await task


async def test_a_batch_is_halved_down_to_the_rows_the_database_refuses(
    database_url: str, sessions: async_sessionmaker[Any]
) -> None:
    template = rows_for_test()
    bad_ids = {"j07", "j08", "j31"}

    def item(i: int) -> Item:
        row = {**template, "id": f"j{i:02d}", "last_seq": i}
        if row["id"] in bad_ids:
            row.update(refused_value(database_url))
        return Item("job", row["id"], i, ((JobRow, row),))

    items = [item(i) for i in range(1, 41)]
    items.append(Item("job", "unmapped\n", 41, (), error="row not computed: KeyError"))
    previously = {("job", "j02"), ("job", "j07")}  # j02 goes in now: it leaves
    old = {"projection": "p", "seq": 0, "error": "old", "row": "{}", "at": datetime.now(UTC)}
    entries = [{**old, "kind": kind, "key": key} for kind, key in sorted(previously)]
    async with sessions.begin() as session:
        await upsert_on_key(session, ProjectionQuarantine, entries, ["projection", "kind", "key"])

    refused = await write_batch(sessions, "p", items, upsert_items, 41, previously)

    assert sorted(r.item.key for r in refused) == ["j07", "j08", "j31", "unmapped\n"]
    async with sessions() as session:
        written = set(await session.scalars(select(JobRow.id)))
        assert written == {f"j{i:02d}" for i in range(1, 41)} - bad_ids
        assert await load_checkpoint(session, "p") == 41
    found = await quarantine(sessions)
    assert sorted(found) == ["j07", "j08", "j31", "unmapped\\n"]  # the key escaped
    assert found["j07"].seq == 7 and found["j07"].error != "old"  # the newer refusal


async def test_only_refusals_of_the_data_are_data_errors(database_url: str, tmp_path: Any) -> None:
    """A refused value is; a missing table or an unreachable database is not (retried)."""
    row = {**rows_for_test(), **refused_value(database_url)}

    async def error_of(url: str, migrated: bool) -> BaseException:
        if migrated:
            await upgrade(url)
        engine = make_engine(url)
        try:
            async with make_sessionmaker(engine).begin() as session:
                await upsert_newer(session, JobRow, [row], ["id"])
        except Exception as exc:
            return exc
        finally:
            await engine.dispose()
        raise AssertionError("the database took the row")

    assert is_data_error(await error_of(database_url, migrated=True))
    await downgrade(database_url, "base")
    assert not is_data_error(await error_of(database_url, migrated=False))
    away = (
        "postgresql+asyncpg://postgres@127.0.0.1:1/test"
        if database_url.startswith("postgresql")
        else f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/x.db"
    )
    if away.startswith("sqlite"):
        (tmp_path / "no").write_text("a file where a folder should be")
    try:
        unreachable = await error_of(away, migrated=False)
    except OSError as exc:  # preparing the SQLite folder fails first
        unreachable = exc
    assert not is_data_error(unreachable)


def rows_for_test() -> dict[str, Any]:
    log = LogBuilder()
    log.submit("j1")
    state = log.state()
    return rows.job_row(state.jobs["j1"], state)


async def test_the_quarantine_migration_goes_down_and_up(database_url: str) -> None:
    async def tables() -> set[str]:
        engine = make_engine(database_url)
        try:
            async with engine.connect() as conn:
                return set(await conn.run_sync(lambda c: inspect(c).get_table_names()))
        finally:
            await engine.dispose()

    await upgrade(database_url)
    assert "projection_quarantine" in await tables()
    await downgrade(database_url, "0005")
    assert "projection_quarantine" not in await tables()
    assert "jobs" in await tables()
    await upgrade(database_url)
    assert "projection_quarantine" in await tables()


async def test_an_array_is_written_in_chunks_and_the_checkpoint_moves_with_the_last(
    database_url: str, sessions: async_sessionmaker[Any], bus: EventBus
) -> None:
    """1,234 tasks touched by one event: written `ROWS_PER_WRITE` a transaction (the
    gateway answers between two), every row there, the checkpoint at the event."""
    stop = asyncio.Event()
    projector = Projector(bus, sessions)
    task = asyncio.create_task(projector.run(stop))
    try:
        spec = make_job_spec(name="sweep", array=1234)
        seq = await put(bus, JobArraySubmitted(job_id="sweep", spec=spec))
        assert await projector.wait_for(seq, 30)
        ids = await job_ids(sessions)
        assert len(ids) == 1234 > ROWS_PER_WRITE and ids[0] == "sweep-0"
        admitted = await put(bus, JobAdmitted(job_id="sweep"))  # one event, every task
        assert await projector.wait_for(admitted, 30)
        async with sessions() as session:
            assert await load_checkpoint(session, CHECKPOINT) == admitted
            states = set(await session.scalars(select(JobRow.state)))
        assert states == {"admitted"}
    finally:
        stop.set()
        await task

"""Portable "insert, or replace only with a newer row" for SQLite and PostgreSQL."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from gpuloom.store.models import Base, ProjectionCheckpoint

#: Rows per statement: stays under SQLite's bound-parameter limit.
CHUNK = 200


def _insert(session: AsyncSession, table: Table) -> Any:
    dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
    return (postgresql.insert if dialect == "postgresql" else sqlite.insert)(table)


async def upsert_newer(
    session: AsyncSession, model: type[Base], rows: Sequence[dict[str, Any]], key: Sequence[str]
) -> None:
    """Insert `rows`; on a key conflict replace the stored row only if `last_seq` grew."""
    await _upsert(session, model, rows, key, newer_only=True)


async def upsert_on_key(
    session: AsyncSession, model: type[Base], rows: Sequence[dict[str, Any]], key: Sequence[str]
) -> None:
    """Insert `rows`; on a key conflict replace the stored row whatever it holds."""
    await _upsert(session, model, rows, key, newer_only=False)


async def _upsert(
    session: AsyncSession,
    model: type[Base],
    rows: Sequence[dict[str, Any]],
    key: Sequence[str],
    *,
    newer_only: bool,
) -> None:
    if not rows:
        return
    table: Table = model.__table__  # type: ignore[assignment]
    stmt = _insert(session, table)
    updates = {c.name: stmt.excluded[c.name] for c in table.columns if c.name not in key}
    where = table.c.last_seq < stmt.excluded.last_seq if newer_only else None
    stmt = stmt.on_conflict_do_update(index_elements=list(key), set_=updates, where=where)
    await _execute_many(session, stmt, rows)


async def insert_ignore(
    session: AsyncSession, model: type[Base], rows: Sequence[dict[str, Any]], key: Sequence[str]
) -> None:
    """Insert `rows`, keeping any row already stored under the same key (ledger semantics)."""
    if not rows:
        return
    table: Table = model.__table__  # type: ignore[assignment]
    stmt = _insert(session, table).on_conflict_do_nothing(index_elements=list(key))
    await _execute_many(session, stmt, rows)


async def _execute_many(session: AsyncSession, stmt: Any, rows: Sequence[dict[str, Any]]) -> None:
    """One statement, its rows as parameters (executemany), `CHUNK` rows at a time.

    Not `.values(rows)`: a statement with the rows in it is a new statement to
    compile for every batch (a large part of a writer's CPU under a burst);
    one with parameters is compiled once and cached.
    """
    for start in range(0, len(rows), CHUNK):
        await session.execute(stmt, [dict(row) for row in rows[start : start + CHUNK]])


async def save_checkpoint(session: AsyncSession, name: str, seq: int) -> None:
    """Move projection `name` forward to `seq` (never backward), in the caller's transaction."""
    table: Table = ProjectionCheckpoint.__table__  # type: ignore[assignment]
    stmt = _insert(session, table).values(name=name, last_seq=seq)
    stmt = stmt.on_conflict_do_update(
        index_elements=["name"],
        set_={"last_seq": stmt.excluded.last_seq},
        where=table.c.last_seq < stmt.excluded.last_seq,
    )
    await session.execute(stmt)


async def load_checkpoint(session: AsyncSession, name: str) -> int:
    row = await session.get(ProjectionCheckpoint, name)
    return row.last_seq if row is not None else 0

"""Write a projection's batch so that no row the database refuses can stop it.

A batch is first written in one transaction with the checkpoint. When the
database refuses it for a reason that is about the data (a NUL on PostgreSQL, a
string longer than its column, an integer out of range, a NOT NULL column given
None), the batch is split in halves, each written in its own transaction, down
to the single rows that are refused; those are kept in `projection_quarantine`
(escaped, so that the quarantine itself cannot be refused) in the transaction
that moves the checkpoint on. Errors that say the database is away (connection
lost, locked, disk full, missing table) are raised: the caller retries the whole
batch later, as before.

Rows written by the halves are committed before the checkpoint: that is safe
because every projection's write is idempotent (newer-row upserts, ledger
inserts that ignore repeats), and a crash before the checkpoint redoes the batch.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Table, delete, func, select
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, StatementError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpuloom.store.models import Base, ProjectionQuarantine
from gpuloom.store.upsert import insert_ignore, save_checkpoint, upsert_newer, upsert_on_key

#: SQLSTATE classes that blame the data: 22 data exception, 23 integrity
#: constraint violation, 54 program limit exceeded (e.g. an index row too large).
DATA_SQLSTATE_CLASSES = frozenset({"22", "23", "54"})
KEY_CHARS = 200
ERROR_CHARS = 1000
ROW_CHARS = 100_000


@dataclass(frozen=True, slots=True)
class Item:
    """The rows one aggregate (a job, a node, a charge) adds to a projection.

    `error` set: the rows could not even be computed; the item goes straight to
    the quarantine with that error.
    """

    kind: str
    key: str
    seq: int
    rows: tuple[tuple[type[Base], dict[str, Any]], ...]
    error: str | None = None

    @property
    def entry_key(self) -> tuple[str, str]:
        """(kind, key) as the quarantine stores it."""
        return self.kind, quarantine_key(self.key)


@dataclass(frozen=True, slots=True)
class Refused:
    item: Item
    error: str


Writer = Callable[[AsyncSession, Sequence[Item]], Awaitable[None]]


def is_data_error(exc: BaseException) -> bool:
    """Whether the database refused the rows themselves (True) or is away (False)."""
    if isinstance(exc, DBAPIError):
        if exc.connection_invalidated:
            return False
        if isinstance(exc, DataError | IntegrityError):
            return True
        code = getattr(exc.orig, "sqlstate", None) or getattr(exc.orig, "pgcode", None)
        return isinstance(code, str) and code[:2] in DATA_SQLSTATE_CLASSES
    if isinstance(exc, StatementError):
        return True  # raised while binding parameters, before the database was asked
    # drivers that refuse a value while binding it (sqlite3: int over 2^63, lone surrogate)
    return isinstance(exc, ValueError | TypeError | OverflowError)


def printable(text: str) -> str:
    """`text` with every unprintable character (NUL, newline, lone surrogate) escaped."""
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text
    )


def quarantine_key(key: str) -> str:
    return printable(key)[:KEY_CHARS]


def describe(exc: BaseException) -> str:
    """One printable line naming the driver's error, without the statement or its values."""
    orig: BaseException = exc
    if isinstance(exc, StatementError) and isinstance(exc.orig, BaseException):
        orig = exc.orig
    driver = orig.__cause__ or orig  # asyncpg's own exception under SQLAlchemy's adapter
    code = getattr(driver, "sqlstate", None) or getattr(orig, "sqlstate", None)
    name = type(driver).__name__ + (f" [{code}]" if isinstance(code, str) else "")
    return printable(f"{name}: {driver}")[:ERROR_CHARS]


def _plain(value: Any) -> Any:
    if isinstance(value, str):
        return printable(value)
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else repr(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, dict):
        return {printable(str(k)): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return printable(repr(value))


def row_json(item: Item) -> str:
    """The item's rows as JSON text the database cannot refuse (escaped, bounded)."""
    doc = {model.__tablename__: _plain(row) for model, row in item.rows}
    text = json.dumps(doc, ensure_ascii=False)
    if len(text) > ROW_CHARS:
        text = json.dumps({"truncated": True, "head": text[:ROW_CHARS]}, ensure_ascii=False)
    return text


def _by_model(items: Sequence[Item]) -> dict[type[Base], list[dict[str, Any]]]:
    grouped: dict[type[Base], list[dict[str, Any]]] = {}
    for item in items:
        for model, row in item.rows:
            grouped.setdefault(model, []).append(row)
    return grouped


def _key(model: type[Base]) -> list[str]:
    table: Table = model.__table__  # type: ignore[assignment]
    return [c.name for c in table.primary_key.columns]


async def upsert_items(session: AsyncSession, items: Sequence[Item]) -> None:
    """Read-model writer: replace stored rows only with newer ones."""
    for model, rows in _by_model(items).items():
        await upsert_newer(session, model, rows, _key(model))


async def insert_items(session: AsyncSession, items: Sequence[Item]) -> None:
    """Ledger writer: insert rows, ignoring repeats."""
    for model, rows in _by_model(items).items():
        await insert_ignore(session, model, rows, _key(model))


async def write_batch(
    sessions: async_sessionmaker[Any],
    projection: str,
    items: Sequence[Item],
    write: Writer,
    seq: int,
    quarantined: Collection[tuple[str, str]] = (),
) -> list[Refused]:
    """Write `items` and move `projection` to `seq`; return the items quarantined.

    `quarantined` are the (kind, key) entries already in the quarantine: those of
    items that go in now leave it; those refused again get the newer entry.
    Raises when the database is away (nothing is quarantined then).
    """
    good = [item for item in items if item.error is None]
    refused = [Refused(item, item.error) for item in items if item.error is not None]
    try:
        async with sessions.begin() as session:
            await write(session, good)
            await _finish(session, projection, seq, good, refused, quarantined)
        return refused
    except Exception as exc:
        if not is_data_error(exc):
            raise
    if len(good) > 1:  # the whole batch was just refused: start with its halves
        middle = len(good) // 2
        refused += await _isolate(sessions, good[:middle], write)
        refused += await _isolate(sessions, good[middle:], write)
    else:
        refused += await _isolate(sessions, good, write)
    gone = {id(r.item) for r in refused}
    async with sessions.begin() as session:
        written = [item for item in good if id(item) not in gone]
        await _finish(session, projection, seq, written, refused, quarantined)
    return refused


async def _isolate(
    sessions: async_sessionmaker[Any], items: Sequence[Item], write: Writer
) -> list[Refused]:
    """Commit what goes in of `items`, halving on each data error; return what is refused."""
    if not items:
        return []
    try:
        async with sessions.begin() as session:
            await write(session, items)
        return []
    except Exception as exc:
        if not is_data_error(exc):
            raise
        if len(items) == 1:
            return [Refused(items[0], describe(exc))]
    middle = len(items) // 2
    return await _isolate(sessions, items[:middle], write) + await _isolate(
        sessions, items[middle:], write
    )


async def _finish(
    session: AsyncSession,
    projection: str,
    seq: int,
    written: Sequence[Item],
    refused: Sequence[Refused],
    quarantined: Collection[tuple[str, str]],
) -> None:
    released = sorted({item.entry_key for item in written} & set(quarantined))
    table: Table = ProjectionQuarantine.__table__  # type: ignore[assignment]
    for kind, key in released:
        await session.execute(
            delete(table).where(
                table.c.projection == projection, table.c.kind == kind, table.c.key == key
            )
        )
    if refused:
        now = datetime.now(UTC)
        entries = {
            r.item.entry_key: {
                "projection": projection,
                "kind": r.item.kind,
                "key": r.item.entry_key[1],
                "seq": r.item.seq,
                "error": printable(r.error)[:ERROR_CHARS],
                "row": row_json(r.item),
                "at": now,
            }
            for r in refused
        }
        await upsert_on_key(
            session, ProjectionQuarantine, list(entries.values()), ["projection", "kind", "key"]
        )
    await save_checkpoint(session, projection, seq)


async def load_quarantined(session: AsyncSession, projection: str) -> set[tuple[str, str]]:
    """The (kind, key) entries `projection` has in the quarantine."""
    result = await session.execute(
        select(ProjectionQuarantine.kind, ProjectionQuarantine.key).where(
            ProjectionQuarantine.projection == projection
        )
    )
    return {(kind, key) for kind, key in result.all()}


async def count_quarantined(session: AsyncSession) -> dict[str, int]:
    """Entries in the quarantine by projection."""
    result = await session.execute(
        select(ProjectionQuarantine.projection, func.count()).group_by(
            ProjectionQuarantine.projection
        )
    )
    return {name: int(count) for name, count in result.all()}

"""SQLite reads made on the event loop's own thread, without a worker thread.

aiosqlite runs every statement on a thread of its own: each `execute`, `fetch`, `begin`
and `rollback` is a hop to that thread and back through the event loop. While the loop
is busy (a gateway folding another user's burst of events), each hop waits for its turn,
so a read of ten hops took 5 times as long as at idle although SQLite answered in 0.2 ms.
A read of a local SQLite file in WAL mode never waits for the writer (another process),
so it is cheaper to make it where it is asked for: `InlineSession` has the
`AsyncSession` methods the reads use, each done at once on a synchronous session.

Only for reads: nothing here commits, and the connection is read-only (`query_only`).
PostgreSQL keeps its asynchronous driver (asyncpg runs on the loop, no thread).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from sqlalchemy import Engine, Result, ScalarResult, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

#: What makes a read session (`async with sessions() as session`): an `async_sessionmaker`
#: or `inline_reads`'s.
ReadSessions = Callable[[], AbstractAsyncContextManager[Any]]

#: How long a read waits on a lock before it fails (never 30 s on the loop): a reader
#: of a WAL database waits only while the writer recovers it after a crash.
BUSY_TIMEOUT_MS = 1000


class InlineSession:
    """The read methods of an `AsyncSession`, done synchronously on the caller's thread."""

    def __init__(self, session: Session) -> None:
        self._session = session

    async def get(self, entity: Any, ident: Any) -> Any:
        return self._session.get(entity, ident)

    async def scalar(self, statement: Any) -> Any:
        return self._session.scalar(statement)

    async def scalars(self, statement: Any) -> ScalarResult[Any]:
        return self._session.scalars(statement)

    async def execute(self, statement: Any) -> Result[Any]:
        return self._session.execute(statement)


def inline_reads(url: str) -> ReadSessions | None:
    """Sessions that read the SQLite database at `url` on the loop's thread; None when
    `url` is not a SQLite file (use the asynchronous sessions then)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    engine = _engine(parsed.set(drivername="sqlite"))
    made = sessionmaker(engine, expire_on_commit=False)

    @asynccontextmanager
    async def session() -> AsyncIterator[InlineSession]:
        with made() as sync:  # closing ends its transaction; the rows read stay loaded
            yield InlineSession(sync)

    return session


def _engine(url: Any) -> Engine:
    engine = create_engine(url)

    @event.listens_for(engine, "connect")
    def _pragmas(dbapi_connection: Any, _record: Any) -> None:
        cursor = dbapi_connection.cursor()
        cursor.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA query_only=ON")  # a read path never writes
        cursor.close()

    return engine

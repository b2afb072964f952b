"""Who owns a job, from the gateway's read model (`jobs`): for a job a fold forgot
(final, charged, and past the tombstones' window: `gpuloom.state.retention`)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.auth.visibility import LookupOwner, Owner
from gpuloom.store.models import JobRow


def read_model_owner(sessions: async_sessionmaker[Any]) -> LookupOwner:
    """A lookup of a job's (user, account) in the `jobs` table; None: no such row."""

    async def lookup(job_id: str) -> Owner | None:
        async with sessions() as session:
            found = await session.execute(
                select(JobRow.user, JobRow.account).where(JobRow.id == job_id)
            )
            row = found.first()
        return (row[0], row[1]) if row is not None else None

    return lookup

"""Who owns a job, from the gateway's read model (`jobs`): for a job a fold forgot
(final, charged, and past the tombstones' window: `gpuloom.state.retention`)."""

from __future__ import annotations

from sqlalchemy import select

from gpuloom.auth.visibility import LookupOwner, Owner
from gpuloom.store.inline import ReadSessions
from gpuloom.store.models import JobRow


def read_model_owner(sessions: ReadSessions) -> LookupOwner:
    """A lookup of a job's (user, account) in the `jobs` table; None: no such row."""

    async def lookup(job_id: str) -> Owner | None:
        async with sessions() as session:
            found = await session.execute(
                select(JobRow.user, JobRow.account).where(JobRow.id == job_id)
            )
            row = found.first()
        return (row[0], row[1]) if row is not None else None

    return lookup

"""Helpers of the projection tests: events straight onto the log, a row mapper the
real database refuses for some jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpuloom.bus import EventBus, Outgoing
from gpuloom.events import Event, JobSubmitted, encode, make_envelope, subject_for
from gpuloom.state import ClusterState, JobState
from gpuloom.store import rows
from gpuloom.testing.builders import make_job_spec


def refused_value(database_url: str) -> dict[str, Any]:
    """Row fields the real database refuses: a NUL (PostgreSQL), an int over 2^63 (SQLite)."""
    if database_url.startswith("postgresql"):
        return {"name": "evil\x00name"}
    return {"submit_seq": 2**63}


async def put(bus: EventBus, *events: Event) -> int:
    """Publish `events` straight onto the log, as any writer could; the last seq."""
    seq = 0
    for event in events:
        envelope = make_envelope(event, at=datetime.now(UTC), by="test")
        message = Outgoing(subject_for(event), encode(envelope), {"Nats-Msg-Id": envelope.id})
        seq, _ = await bus.publish(message)
    return seq


def submit(job_id: str) -> JobSubmitted:
    return JobSubmitted(job_id=job_id, spec=make_job_spec(name=f"job-{job_id}"))


class Refusing:
    """`rows.job_row`, except that some jobs' rows carry a value the database refuses.

    `bad-forever` always; `bad-once` while it is only submitted. Counts the rows it
    makes per job, to tell a retry loop from a quiet projection.
    """

    def __init__(self, refused: dict[str, Any]) -> None:
        self.refused = refused
        self.made: dict[str, int] = {}

    def __call__(self, job: JobState, state: ClusterState) -> dict[str, Any]:
        self.made[job.job_id] = self.made.get(job.job_id, 0) + 1
        row = rows.job_row(job, state)
        if job.job_id == "bad-forever" or (job.job_id == "bad-once" and job.phase == "submitted"):
            row.update(self.refused)
        return row


async def until(predicate: Callable[[], bool], timeout: float = 15) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not predicate():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.02)

"""Helpers of the projection tests: events straight onto the log, a row mapper the
real database refuses for some jobs."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus import EventBus, Outgoing
from gpuloom.events import (
    Event,
    JobSubmitted,
    Recorded,
    UsageCharged,
    encode,
    make_envelope,
    subject_for,
)
from gpuloom.runtime.reactor import Reactor, pure
from gpuloom.runtime.snapshots import Snapshotter
from gpuloom.state import ClusterState, JobState
from gpuloom.store import rows
from gpuloom.testing.builders import LogBuilder, make_job_spec
from services.accounting.ledger import ChargeRows, Ledger, charge_rows


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


async def put_records(bus: EventBus, records: list[Recorded]) -> list[int]:
    """Publish built events (`LogBuilder`) as they are, with their own `at`; their seqs."""
    seqs = []
    for record in records:
        envelope = record.envelope
        message = Outgoing(
            subject_for(record.event), encode(envelope), {"Nats-Msg-Id": envelope.id}
        )
        seqs.append((await bus.publish(message))[0])
    return seqs


def charged_runs(log: LogBuilder, *job_ids: str) -> dict[str, Recorded]:
    """Jobs that each ran a minute on node n1 (registered first if `log` is empty), then
    were charged; the charge of each."""
    if not log.records:
        log.register("n1", 8)
    charges = {}
    for index, job_id in enumerate(job_ids):
        log.run_to_queue(job_id, gpus=1)
        log.place(job_id, "n1", [index % 8])
        log.start(job_id, "n1")
        log.finish(job_id, "n1", after=60)
        charges[job_id] = log.append(
            UsageCharged(
                job_id=job_id, attempt=1, user="alice", account="research", gpus=1,
                seconds=60.0, gpu_milli_seconds=60_000, by_model={"A100-80GB": 60_000},
            )
        )  # fmt: skip
    return charges


def near_now() -> LogBuilder:
    """A log whose times are near the server's stamps (the fold bounds an `at` to them)."""
    return LogBuilder(start=datetime.now(UTC) - timedelta(minutes=2), step=timedelta(seconds=0.1))


def accounting_ledger(
    bus: EventBus,
    sessions: async_sessionmaker[Any],
    *,
    rows: ChargeRows = charge_rows,
    snapshots: Snapshotter | None = None,
) -> Reactor:
    """Accounting's reactor with its ledger, deciding nothing (the test writes the charges)."""
    ledger = Ledger(sessions, rows=rows)
    return Reactor(
        bus, "accounting", pure(lambda state: []), projections=[ledger], snapshots=snapshots
    )


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

"""The usage ledger: the charges accounting's fold applied -> `usage_charges` rows.

The ledger is a projection of the accounting reactor's own fold (`Reactor`'s
`projections`): it sees each `UsageCharged` after the fold, and keeps only those the
fold applied, so it never stores a charge the fold voided (a repeat, a charge of an
unknown run, one past a run's end). Its rows and its SQL checkpoint are committed in
one transaction; the reactor starts from a snapshot no newer than that checkpoint, so
after a crash (or a database restored from an older backup) the charges after the
checkpoint are folded again and written again, and the insert (keyed by job, attempt
and part) ignores those already there. A database that is away keeps the charges in
memory (a few per job) and the reactor goes on deciding; they are written when it
answers.

A charge whose rows the database refuses is quarantined (kind `charge`, key
`job/attempt/part`) and the ledger goes on; `rows` is a parameter so that a test
can make the database refuse a charge for real.

Before 2026-12-05 the ledger read the log through a durable consumer of its own
(`RETIRED_DURABLE`); a start deletes it where an older version left it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus import Incoming
from gpuloom.events import Recorded, UsageCharged
from gpuloom.state import Folded
from gpuloom.store.models import Base, UsageChargeRow, UsageModelChargeRow
from gpuloom.store.quarantine import Item, count_quarantined, describe, insert_items, write_batch
from gpuloom.store.upsert import load_checkpoint
from gpuloom.telemetry.metrics import PROJECTION_LAG, PROJECTION_QUARANTINED

log = logging.getLogger(__name__)

CHECKPOINT = "accounting.ledger"
#: The durable consumer of versions before 2026-12-05 (`gpuloom.bus.identities`).
RETIRED_DURABLE = "accounting-ledger"
#: With nothing to write, the checkpoint still follows the fold this often, seconds
#: (the lag the gateway shows, and how far back a restart starts).
IDLE_CHECKPOINT_S = 1.0

ChargeRows = Callable[[int, UsageCharged, datetime], list[tuple[type[Base], dict[str, Any]]]]


def _row(seq: int, event: UsageCharged, at: Any) -> dict[str, Any]:
    return {
        "job_id": event.job_id,
        "attempt": event.attempt,
        "part": event.part,
        "user": event.user,
        "account": event.account,
        "gpus": event.gpus,
        "seconds": event.seconds,
        "gpu_milli_seconds": event.gpu_milli_seconds,
        "charged_at": at,
        "seq": seq,
    }


def _model_rows(seq: int, event: UsageCharged, at: Any) -> list[dict[str, Any]]:
    return [
        {
            "job_id": event.job_id,
            "attempt": event.attempt,
            "part": event.part,
            "gpu_model": model,
            "user": event.user,
            "account": event.account,
            "gpu_milli_seconds": milli_seconds,
            "charged_at": at,
            "seq": seq,
        }
        for model, milli_seconds in sorted(event.by_model.items())
    ]


def charge_rows(
    seq: int, event: UsageCharged, at: datetime
) -> list[tuple[type[Base], dict[str, Any]]]:
    """The ledger rows of one charge: the charge, then its split by GPU model."""
    rows: list[tuple[type[Base], dict[str, Any]]] = [(UsageChargeRow, _row(seq, event, at))]
    rows += [(UsageModelChargeRow, row) for row in _model_rows(seq, event, at)]
    return rows


class Ledger:
    """The charges the fold applied, written to SQL with the checkpoint."""

    def __init__(
        self,
        sessions: async_sessionmaker[Any],
        *,
        rows: ChargeRows = charge_rows,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.sessions = sessions
        self.rows = rows
        self.clock = clock
        #: Charges of every event up to here are written (or quarantined).
        self.written_seq = 0
        self._items: list[Item] = []
        #: The last event the fold handed it (a charge or not).
        self._seen_seq = 0
        self._written_at = clock()
        self._failing = False
        #: The log's last sequence as last seen: the lag the ledger reports.
        self.stream_seq = 0

    async def load(self, stop: asyncio.Event) -> bool:
        """Read the checkpoint, waiting for the database; False: stopped first."""
        while not stop.is_set():
            try:
                async with self.sessions() as session:
                    self.written_seq = await load_checkpoint(session, CHECKPOINT)
                    quarantined = (await count_quarantined(session)).get(CHECKPOINT, 0)
            except Exception:  # the database is away (or not migrated yet)
                log.exception("ledger cannot read its checkpoint; retrying")
                await asyncio.sleep(1.0)
                continue
            PROJECTION_QUARANTINED.labels(CHECKPOINT).set(quarantined)
            log.info("ledger resumes after seq %d", self.written_seq)
            return True
        return False

    def before(self, recorded: Recorded) -> None:
        pass

    def after(self, message: Incoming, recorded: Recorded, folded: Folded) -> None:
        self.stream_seq = max(self.stream_seq, message.seq + message.pending)
        self._seen_seq = recorded.seq
        event = recorded.event
        if folded.applied and isinstance(event, UsageCharged) and recorded.seq > self.written_seq:
            self._items.append(self._item(recorded.seq, event, recorded.envelope.at))

    def _item(self, seq: int, event: UsageCharged, at: datetime) -> Item:
        """The item of one charge; one whose rows cannot be computed is quarantined."""
        key = f"{event.job_id}/{event.attempt}/{event.part}"
        try:
            return Item("charge", key, seq, tuple(self.rows(seq, event, at)))
        except Exception as exc:
            log.exception("ledger could not compute the rows of charge %s", key)
            return Item("charge", key, seq, (), error=f"rows not computed: {describe(exc)}")

    def behind(self) -> bool:
        """Charges wait, or the checkpoint is behind the fold (written within
        `IDLE_CHECKPOINT_S` once the log is quiet)."""
        return bool(self._items) or self._seen_seq > self.written_seq

    async def flush(self, seq: int, *, force: bool) -> None:
        idle_due = self.clock() - self._written_at >= IDLE_CHECKPOINT_S
        if seq <= self.written_seq or not (self._items or force or idle_due):
            return
        try:  # a refused charge is quarantined in the checkpoint's transaction
            refused = await write_batch(self.sessions, CHECKPOINT, self._items, insert_items, seq)
        except Exception as exc:  # away: keep the charges, try again on the next round
            if not self._failing:
                log.warning("ledger could not write charges up to seq %d: %r", seq, exc)
            self._failing = True
            return
        self._failing = False
        for entry in refused:
            log.error("ledger quarantined charge %s: %s", entry.item.key, entry.error)
            PROJECTION_QUARANTINED.labels(CHECKPOINT).inc()
        self._items.clear()
        self.written_seq, self._written_at = seq, self.clock()
        PROJECTION_LAG.labels(CHECKPOINT).set(max(0, self.stream_seq - seq))

"""The usage ledger: UsageCharged events -> `usage_charges` rows, through a durable
pull consumer with explicit ack.

A message is acked only after its row and the checkpoint are committed, so a
crash redelivers it and the insert (keyed by job and attempt) ignores the
repeat. The SQL checkpoint is the truth about the ledger's position: at start,
when the consumer's ack floor is past the checkpoint (the tables were dropped
or restored from an older backup), the consumer is re-created from the
checkpoint and the ledger is rebuilt from the log.

A charge whose rows the database refuses is quarantined (kind `charge`, key
`job/attempt/part`) and the ledger goes on; `rows` is a parameter so that a test
can make the database refuse a charge for real.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime
from typing import Any

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus import EventBus
from gpuloom.events import MalformedEvent, UsageCharged, decode
from gpuloom.events.subjects import EVENT_PREFIX
from gpuloom.store.models import Base, UsageChargeRow, UsageModelChargeRow
from gpuloom.store.quarantine import Item, count_quarantined, insert_items, write_batch
from gpuloom.store.upsert import load_checkpoint
from gpuloom.telemetry.metrics import PROJECTION_LAG, PROJECTION_QUARANTINED

log = logging.getLogger(__name__)

CHECKPOINT = "accounting.ledger"
DURABLE = "accounting-ledger"
SUBJECT = f"{EVENT_PREFIX}.job.*.UsageCharged"

ChargeRows = Callable[[int, UsageCharged, datetime], list[tuple[type[Base], dict[str, Any]]]]


async def _consumer_from(bus: EventBus, checkpoint: int) -> None:
    """Make sure the durable consumer resumes right after `checkpoint`."""
    try:
        info = await bus.js.consumer_info(bus.stream, DURABLE)
    except NotFoundError:
        info = None
    if info is not None and int(info.ack_floor.stream_seq or 0) <= checkpoint:
        return
    if info is not None:
        log.warning(
            "ledger checkpoint %d is behind the consumer (ack floor %s): rebuilding",
            checkpoint,
            info.ack_floor.stream_seq,
        )
        await bus.js.delete_consumer(bus.stream, DURABLE)
    config = ConsumerConfig(
        durable_name=DURABLE,
        filter_subject=SUBJECT,
        ack_policy=AckPolicy.EXPLICIT,
        ack_wait=30,
        max_ack_pending=5000,
        deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
        opt_start_seq=checkpoint + 1,
    )
    await bus.js.add_consumer(bus.stream, config)


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


async def run_ledger(
    bus: EventBus,
    sessions: async_sessionmaker[Any],
    stop: asyncio.Event,
    *,
    rows: ChargeRows = charge_rows,
) -> None:
    async with sessions() as session:
        checkpoint = await load_checkpoint(session, CHECKPOINT)
        quarantined = (await count_quarantined(session)).get(CHECKPOINT, 0)
    PROJECTION_QUARANTINED.labels(CHECKPOINT).set(quarantined)
    await _consumer_from(bus, checkpoint)
    sub = await bus.js.pull_subscribe_bind(DURABLE, stream=bus.stream)
    log.info("ledger resumes after seq %d", checkpoint)
    try:
        await _consume(sub, sessions, stop, checkpoint, rows)
    finally:
        await sub.unsubscribe()  # a pull subscription left open stalls the drain on exit


async def _consume(
    sub: JetStreamContext.PullSubscription,
    sessions: async_sessionmaker[Any],
    stop: asyncio.Event,
    checkpoint: int,
    rows: ChargeRows,
) -> None:
    while not stop.is_set():
        try:
            messages = await sub.fetch(500, timeout=1)
        except (NatsTimeoutError, TimeoutError):
            continue
        items: list[Item] = []
        last = checkpoint
        for msg in messages:
            seq = int(msg.metadata.sequence.stream)
            last = max(last, seq)
            try:
                recorded = decode(seq, msg.data, msg.metadata.timestamp, subject=msg.subject)
            except MalformedEvent as exc:
                log.error("ledger skipping malformed event: %s", exc)
                continue
            event = recorded.event
            if isinstance(event, UsageCharged):
                key = f"{event.job_id}/{event.attempt}/{event.part}"
                charge = tuple(rows(seq, event, recorded.envelope.at))
                items.append(Item("charge", key, seq, charge))
        # a refused charge is quarantined in the checkpoint's transaction; "away" raises
        for refused in await write_batch(sessions, CHECKPOINT, items, insert_items, last):
            log.error("ledger quarantined charge %s: %s", refused.item.key, refused.error)
            PROJECTION_QUARANTINED.labels(CHECKPOINT).inc()
        PROJECTION_LAG.labels(CHECKPOINT).set(messages[-1].metadata.num_pending if messages else 0)
        checkpoint = last
        for msg in messages:
            await msg.ack()

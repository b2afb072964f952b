"""The usage ledger: UsageCharged events -> `usage_charges` rows, through a durable
pull consumer with explicit ack.

A message is acked only after its row and the checkpoint are committed, so a
crash redelivers it and the insert (keyed by job and attempt) ignores the
repeat. The SQL checkpoint is the truth about the ledger's position: at start,
when the consumer's ack floor is past the checkpoint (the tables were dropped
or restored from an older backup), the consumer is re-created from the
checkpoint and the ledger is rebuilt from the log.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from nats.errors import TimeoutError as NatsTimeoutError
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.client import JetStreamContext
from nats.js.errors import NotFoundError
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus import EventBus
from gpuloom.events import MalformedEvent, UsageCharged, decode
from gpuloom.events.subjects import EVENT_PREFIX
from gpuloom.store.models import UsageChargeRow, UsageModelChargeRow
from gpuloom.store.upsert import insert_ignore, load_checkpoint, save_checkpoint

log = logging.getLogger(__name__)

CHECKPOINT = "accounting.ledger"
DURABLE = "accounting-ledger"
SUBJECT = f"{EVENT_PREFIX}.job.*.UsageCharged"


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


async def run_ledger(bus: EventBus, sessions: async_sessionmaker[Any], stop: asyncio.Event) -> None:
    async with sessions() as session:
        checkpoint = await load_checkpoint(session, CHECKPOINT)
    await _consumer_from(bus, checkpoint)
    sub = await bus.js.pull_subscribe_bind(DURABLE, stream=bus.stream)
    log.info("ledger resumes after seq %d", checkpoint)
    try:
        await _consume(sub, sessions, stop, checkpoint)
    finally:
        await sub.unsubscribe()  # a pull subscription left open stalls the drain on exit


async def _consume(
    sub: JetStreamContext.PullSubscription,
    sessions: async_sessionmaker[Any],
    stop: asyncio.Event,
    checkpoint: int,
) -> None:
    while not stop.is_set():
        try:
            messages = await sub.fetch(500, timeout=1)
        except (NatsTimeoutError, TimeoutError):
            continue
        rows = []
        model_rows = []
        last = checkpoint
        for msg in messages:
            seq = int(msg.metadata.sequence.stream)
            last = max(last, seq)
            try:
                recorded = decode(seq, msg.data)
            except MalformedEvent as exc:
                log.error("ledger skipping malformed event: %s", exc)
                continue
            if isinstance(recorded.event, UsageCharged):
                rows.append(_row(seq, recorded.event, recorded.envelope.at))
                model_rows.extend(_model_rows(seq, recorded.event, recorded.envelope.at))
        async with sessions.begin() as session:
            if rows:
                await insert_ignore(session, UsageChargeRow, rows, ["job_id", "attempt", "part"])
            if model_rows:
                await insert_ignore(
                    session,
                    UsageModelChargeRow,
                    model_rows,
                    ["job_id", "attempt", "part", "gpu_model"],
                )
            await save_checkpoint(session, CHECKPOINT, last)
        checkpoint = last
        for msg in messages:
            await msg.ack()

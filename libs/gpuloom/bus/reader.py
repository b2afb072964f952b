"""Read the whole log once, in order: what audits, replays and tests fold."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from typing import Any

from gpuloom.bus.credentials import connect_options
from gpuloom.bus.jetstream import EventBus
from gpuloom.config import load_settings
from gpuloom.events import MalformedEvent, Recorded, decode


async def read_log(
    nats_url: str,
    stream: str = "GPULOOM",
    timeout: float = 120,
    upto: int | None = None,
    options: Mapping[str, Any] | None = None,
) -> list[Recorded]:
    """Every well-formed event in the stream up to `upto` (default: the last), in order.

    Malformed entries are skipped, as every reactor skips them. Read-only: the
    stream is neither created nor changed; a missing one raises `StreamMissingError`
    (an audit of an empty log would pass vacuously, pointed at the wrong NATS).
    `options`: connect options; default, this process's identity (`connect_options`).
    """
    if options is None:
        options = connect_options(load_settings())
    bus = await EventBus.connect(
        nats_url, stream, name="gpuloom-log-reader", create=False, **options
    )
    try:
        last = await bus.last_seq()
        if upto is not None:
            last = min(last, upto)
        records: list[Recorded] = []
        if last == 0:
            return records
        done = asyncio.Event()

        async def on_message(message: Any) -> None:
            if message.seq > last:
                done.set()
                return
            with contextlib.suppress(MalformedEvent):
                records.append(
                    decode(message.seq, message.body, message.stored_at, subject=message.subject)
                )
            if message.seq >= last:
                done.set()

        unsubscribe = await bus.follow(on_message)
        try:
            await asyncio.wait_for(done.wait(), timeout)
        finally:
            await unsubscribe()
        return records
    finally:
        await bus.close()

"""Read the log once, in order (all of it, or from a sequence on), and the snapshots
of every bucket: what audits, replays and tests fold and prove."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gpuloom.bus.archive import MANIFEST, ArchiveError, load_manifest, read_archive
from gpuloom.bus.credentials import connect_options
from gpuloom.bus.identities import SERVICES
from gpuloom.bus.jetstream import EventBus
from gpuloom.bus.jsapi import SNAPSHOT_BUCKET_PREFIX, bucket_of
from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.config import load_settings
from gpuloom.events import MalformedEvent, Recorded, decode


class LogStartDropped(Exception):
    """Events asked for are no longer in the stream: they were archived and dropped."""


async def read_log(
    nats_url: str,
    stream: str = "GPULOOM",
    timeout: float = 120,
    upto: int | None = None,
    options: Mapping[str, Any] | None = None,
    from_seq: int = 1,
) -> list[Recorded]:
    """Every well-formed event in the stream from `from_seq` up to `upto` (default: the
    last), in order. `from_seq`: where a snapshot at `from_seq - 1` leaves off, so that
    an audit or replay from it reads only the rest of the log (an ordered consumer
    that starts there: the events before are not sent at all).

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
        figures = await bus.stream_figures()
        if figures.first_seq > 1 and from_seq < figures.first_seq:
            raise LogStartDropped(
                f"the log starts at seq {figures.first_seq}: its start was dropped (gpuloom "
                f"archive drop); fold from a snapshot at seq {figures.first_seq - 1} or later "
                "(gpuloom audit --from-snapshot; replay finds one by itself), or read the "
                "dropped events from the archive (--archive DIR)"
            )
        last = figures.last_seq
        if upto is not None:
            last = min(last, upto)
        records: list[Recorded] = []
        if last == 0 or from_seq > last:
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

        unsubscribe = await bus.follow(on_message, from_seq=from_seq)
        try:
            await asyncio.wait_for(done.wait(), timeout)
        finally:
            await unsubscribe()
        return records
    finally:
        await bus.close()


async def read_history(
    nats_url: str,
    archive: Path,
    stream: str = "GPULOOM",
    upto: int | None = None,
    options: Mapping[str, Any] | None = None,
    from_seq: int = 1,
) -> list[Recorded]:
    """`read_log` across the archive (`gpuloom.bus.archive`): the events from `from_seq`
    up to `upto` out of the archive's segments (each checked against its sha256), then
    out of the stream from the archive's end on. So an audit from seq 1, or a replay
    to any point, still reads the whole trail once the stream's start was dropped.

    `ArchiveError` when the archive has no segments or starts after `from_seq`;
    `LogStartDropped` when the stream starts after the archive's end (a gap).
    """
    segments = load_manifest(archive)
    if not segments:
        raise ArchiveError(f"{archive}: no segments (no {MANIFEST}): export the log first")
    first, last = segments[0].first, segments[-1].last
    if from_seq < first:
        raise ArchiveError(
            f"the archive in {archive} starts at seq {first}: it cannot give seq {from_seq}"
        )
    records: list[Recorded] = []
    if from_seq <= last:
        for message in read_archive(archive, upto):
            if message.seq >= from_seq:
                with contextlib.suppress(MalformedEvent):
                    records.append(
                        decode(
                            message.seq, message.body, message.stored_at, subject=message.subject
                        )
                    )
    rest = max(from_seq, last + 1)
    if upto is None or rest <= upto:
        records += await read_log(nats_url, stream, upto=upto, options=options, from_seq=rest)
    return records


@dataclass(frozen=True)
class SnapshotRead:
    """One snapshot read back from a snapshot bucket, or why it could not be read."""

    bucket: str
    #: Whose bucket: a service's name (`SERVICES`), or "agent".
    service: str
    name: str
    seq: int
    data: bytes | None = field(default=None, repr=False)
    error: str = ""


def _owner(bucket: str) -> str:
    for service in SERVICES:
        if bucket_of(service) == bucket:
            return service
    if bucket.startswith(f"{SNAPSHOT_BUCKET_PREFIX}AGENT_"):
        return "agent"
    return bucket.removeprefix(SNAPSHOT_BUCKET_PREFIX).lower()


async def read_snapshots(
    nats_url: str, stream: str = "GPULOOM", options: Mapping[str, Any] | None = None
) -> tuple[list[SnapshotRead], list[str]]:
    """Every snapshot in every snapshot bucket (the services', the gateway's and each
    agent's), and the problems met listing them (a bucket that cannot be listed: its
    snapshots are then not read, which is said rather than failed on).

    Read-only: only buckets found among the server's streams are opened, and none is
    created. Reading other processes' buckets takes the admin identity; any other is refused
    by the server, and that is one of the problems returned.
    """
    if options is None:
        options = connect_options(load_settings())
    bus = await EventBus.connect(
        nats_url, stream, name="gpuloom-snapshot-reader", create=False, **options
    )
    found: list[SnapshotRead] = []
    problems: list[str] = []
    try:
        try:
            buckets = await _snapshot_buckets(bus)
        except Exception as exc:
            return found, [f"cannot list the snapshot buckets: {exc!r}"]
        for bucket in buckets:
            store = SnapshotStore(bus.js, _owner(bucket), bucket=bucket)
            try:
                stored = await store.stored()
            except Exception as exc:
                problems.append(f"cannot list bucket {bucket}: {exc!r}")
                continue
            for snapshot in stored:
                try:
                    data = await store.read(snapshot)
                except Exception as exc:  # deleted since listed (a newer one came), ...
                    found.append(
                        SnapshotRead(
                            bucket,
                            store.service,
                            snapshot.name,
                            snapshot.seq,
                            error=f"cannot be read: {exc!r}",
                        )
                    )
                    continue
                found.append(SnapshotRead(bucket, store.service, snapshot.name, snapshot.seq, data))
        return found, problems
    finally:
        await bus.close()


async def _snapshot_buckets(bus: EventBus) -> list[str]:
    """The snapshot buckets on the server: object stores are streams named `OBJ_<bucket>`."""
    prefix = f"OBJ_{SNAPSHOT_BUCKET_PREFIX}"
    names: list[str] = []
    offset = 0
    while True:
        page = await bus.js.streams_info(offset)
        for info in page:
            name = info.config.name or ""
            if name.startswith(prefix):
                names.append(name)
        if not page or offset > 100_000:
            break
        offset += len(page)
    return sorted(name.removeprefix("OBJ_") for name in names)

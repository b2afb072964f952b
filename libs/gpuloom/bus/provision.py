"""What the operator creates on the bus before any gpuloom process starts: the log, its
dead-letter stream, the per-node view, and every service's snapshot bucket.

Why no process creates its own: a JetStream create call carries the whole stream
configuration, and NATS permissions name only the stream, never what is in it. A
process allowed to create its snapshot bucket could create it with `republish` onto
the event subjects, or with `sources` that copy another stream, and so write events it
does not own, past every publish permission of `gpuloom.bus.identities`. So only the
admin creates (`gpuloom bus setup`; the launchers of `make run` and of the tests do it
before they start a process), and a process finds what it needs: a service waits for
the log, and runs without snapshots (one log line) when its bucket is missing.

Creating is idempotent and never changes what exists: an operator's changes to a
stream (limits, replicas) survive every setup.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

import nats
from nats.js import JetStreamContext
from nats.js.api import ObjectStoreConfig, StorageType
from nats.js.errors import BadRequestError, NotFoundError

from gpuloom.bus.identities import SERVICES
from gpuloom.bus.jsapi import BASE_BUCKET, bucket_of
from gpuloom.bus.streams import Expected, ensure_streams

log = logging.getLogger(__name__)

#: The most a snapshot bucket holds, bytes (`keep` snapshots, each at most
#: `gpuloom.bus.snapshots.MAX_READ` compressed, and the chunks of an upload cut short):
#: past it a write fails and is logged, and the snapshots already there stay whole
#: (an object store refuses new messages when full, it never drops old ones).
DEFAULT_BUCKET_MAX_BYTES = 1 << 30


@dataclass(frozen=True, slots=True)
class Bucket:
    """One snapshot bucket to create: its name and whose it is."""

    name: str
    description: str


def buckets() -> list[Bucket]:
    """The snapshot buckets: each service's and the base one. (Agents keep none: their
    state is their nodes' view, `gpuloom.state.nodeview`.)"""
    found = [Bucket(bucket_of(s), f"snapshots of the {s} service's state") for s in SERVICES]
    found.append(Bucket(BASE_BUCKET, "base snapshots at the log's dropped start"))
    return found


async def create_bucket(
    js: JetStreamContext,
    bucket: Bucket,
    *,
    replicas: int = 1,
    max_bytes: int = DEFAULT_BUCKET_MAX_BYTES,
) -> bool:
    """Create `bucket` unless it exists; True when this call created it."""
    stream = f"OBJ_{bucket.name}"
    try:
        await js.stream_info(stream)
        return False
    except NotFoundError:
        pass
    config = ObjectStoreConfig(
        bucket=bucket.name,
        description=bucket.description,
        storage=StorageType.FILE,
        replicas=replicas,
        max_bytes=max_bytes,
    )
    try:
        await js.create_object_store(bucket.name, config)
    except BadRequestError:  # another setup created it meanwhile
        await js.stream_info(stream)
        return False
    return True


async def provision(
    js: JetStreamContext,
    stream: str,
    *,
    expected: Expected = Expected(),
    bucket_max_bytes: int = DEFAULT_BUCKET_MAX_BYTES,
) -> list[str]:
    """Create the log, its dead letters, the per-node view and every snapshot bucket
    that is missing (as admin); the names of the buckets this call created."""
    await ensure_streams(js, stream, expected)
    created = []
    for bucket in buckets():
        if await create_bucket(
            js, bucket, replicas=expected.replicas or 1, max_bytes=bucket_max_bytes
        ):
            created.append(bucket.name)
    if created:
        log.info("created the snapshot buckets %s", ", ".join(created))
    return created


async def provision_at(
    url: str, stream: str, *, expected: Expected = Expected(), **options: Any
) -> list[str]:
    """`provision` over a connection of its own to `url` (the admin's)."""
    nc = await nats.connect(url, connect_timeout=5, max_reconnect_attempts=3, **options)
    try:
        js = nc.jetstream(timeout=10)
        return await provision(js, stream, expected=expected)
    finally:
        await nc.close()


def run_blocking(work: Coroutine[Any, Any, list[str]]) -> list[str]:
    """Run `work` to its end from synchronous code, even code called inside a running
    event loop (a test's): on a thread of its own, with a loop of its own."""
    result: list[list[str]] = []
    failure: list[BaseException] = []

    def body() -> None:
        try:
            result.append(asyncio.run(work))
        except BaseException as exc:
            failure.append(exc)

    thread = threading.Thread(target=body, name="gpuloom-provision")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]
    return result[0]

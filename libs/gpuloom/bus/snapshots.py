"""Where a service keeps snapshots of its folded state: a JetStream object store.

The stack already runs JetStream, so the snapshots live beside the log: no other
storage to run, back up or secure, and an object store splits a large snapshot into
chunks (a KV value is one message, bounded by the server's max payload). Each service
has its own bucket (`GPULOOM_SNAP_<SERVICE>`), so the bus's permissions let it write
only its own (`gpuloom.bus.identities`): a bug or an intruder in one service cannot
hand another a forged state. The operator creates the buckets at setup
(`gpuloom.bus.provision`, which says why no process may); a missing one holds nothing
and takes no snapshot.

Objects are named by the sequence they were folded to (`seq-000000000001234`); the
newest `keep` stay, so that a damaged newest one falls back to the one before. An
object becomes visible only when its metadata is written, after every chunk: a
process killed while writing leaves the previous snapshots as they were. What is in
a snapshot and what makes one untrustworthy is `gpuloom.state.snapshot`'s business;
this module moves bytes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.object_store import ObjectStore

from gpuloom.bus.identities import bucket_of
from gpuloom.bus.provision import Bucket, create_bucket

log = logging.getLogger(__name__)

_NAME = re.compile(r"^seq-(\d{15})$")
#: How long one call to the store may take before the snapshot is given up (a restart
#: then replays more of the log; it never waits on a store that does not answer).
TIMEOUT_S = 30.0


#: The largest snapshot read back: compressed, 64 MiB is far beyond any state the
#: decoder accepts inflated (`gpuloom.state.snapshot.MAX_SIZE`).
MAX_READ = 1 << 26


def object_name(seq: int) -> str:
    return f"seq-{seq:015d}"


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    """One snapshot in the store: the sequence in its name, and its size."""

    seq: int
    name: str
    size: int


class SnapshotStore:
    """One service's snapshots in its object store bucket."""

    def __init__(
        self,
        js: JetStreamContext,
        service: str,
        *,
        keep: int = 2,
        replicas: int = 1,
        bucket: str | None = None,
        create: bool = False,
    ):
        if keep < 1:
            raise ValueError("keep at least one snapshot")
        self.js = js
        self.service = service
        #: A service's bucket by its name; an agent's by its nodes (`agent_bucket`).
        self.bucket = bucket or bucket_of(service)
        #: Create the bucket when missing: the operator's tools only (who may create a
        #: stream may give it any configuration: `gpuloom.bus.provision`).
        self.create = create
        self.keep = keep
        self.replicas = replicas
        self._store: ObjectStore | None = None

    async def _open(self) -> ObjectStore:
        if self._store is None:
            try:
                self._store = await self.js.object_store(self.bucket)
            except BucketNotFoundError:
                if not self.create:
                    raise
                bucket = Bucket(self.bucket, f"snapshots of the {self.service}'s state")
                await create_bucket(self.js, bucket, replicas=self.replicas)
                self._store = await self.js.object_store(self.bucket)
        return self._store

    async def stored(self) -> list[StoredSnapshot]:
        """The snapshots held, newest first (names that are not a snapshot's are ignored)."""
        try:
            store = await self._open()
        except BucketNotFoundError:  # not created at setup: nothing in it
            return []
        try:
            infos = await asyncio.wait_for(store.list(ignore_deletes=True), TIMEOUT_S)
        except NotFoundError:  # what nats-py says of an empty bucket
            return []
        found = []
        for info in infos:
            match = _NAME.match(info.name or "")
            if match is not None and not info.deleted:
                found.append(StoredSnapshot(int(match.group(1)), info.name, int(info.size or 0)))
        return sorted(found, key=lambda s: s.seq, reverse=True)

    async def read(self, snapshot: StoredSnapshot) -> bytes:
        """The bytes of `snapshot` (the store checks its chunks' digest); one larger than
        `MAX_READ` is refused before it is read."""
        if snapshot.size > MAX_READ:
            raise ValueError(f"{snapshot.name} is {snapshot.size} bytes, over {MAX_READ}")
        store = await self._open()
        result = await asyncio.wait_for(store.get(snapshot.name), TIMEOUT_S)
        return bytes(result.data or b"")

    async def write(self, seq: int, data: bytes) -> StoredSnapshot:
        """Store a snapshot folded to `seq`, then drop the older ones past the newest
        `keep`. Never the one just written, and never one past `seq`: that is another
        copy's further along, or of an earlier log (a stream made anew restarts at seq
        1), which restores skip and this prune drops once this log has passed it."""
        store = await self._open()
        name = object_name(seq)
        await asyncio.wait_for(store.put(name, data), TIMEOUT_S)
        older = [s for s in await self.stored() if s.seq < seq]
        for old in older[self.keep - 1 :]:
            try:
                await asyncio.wait_for(store.delete(old.name), TIMEOUT_S)
            except Exception as exc:  # kept one more than asked: harmless, said once
                log.warning("could not delete old snapshot %s: %r", old.name, exc)
        return StoredSnapshot(seq, name, len(data))

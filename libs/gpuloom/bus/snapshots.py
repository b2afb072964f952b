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
process killed while writing leaves the previous snapshots as they were, and chunks
no object names, which the next write sweeps (`sweep`) so that they do not fill the
bucket (it refuses writes past its `max_bytes`, `gpuloom.bus.provision`). What is in
a snapshot and what makes one untrustworthy is `gpuloom.state.snapshot`'s business;
this module moves bytes.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from nats.js import JetStreamContext
from nats.js.errors import BucketNotFoundError, NotFoundError
from nats.js.object_store import ObjectStore

from gpuloom.bus.jsapi import bucket_of
from gpuloom.bus.provision import Bucket, create_bucket

log = logging.getLogger(__name__)

_NAME = re.compile(r"^seq-(\d{15})$")
#: Chunks no object names are an upload cut short once they are this old, seconds (a
#: younger one may be another copy's upload under way: two per `TIMEOUT_S` call).
ORPHAN_AGE_S = 4 * 30.0
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
        #: A service's bucket by its name (the base one: `BASE_BUCKET`).
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
        try:
            await asyncio.wait_for(self.sweep(), TIMEOUT_S)
        except Exception as exc:  # the next write sweeps again
            log.warning("could not sweep the chunks of cut uploads in %s: %r", self.bucket, exc)
        return StoredSnapshot(seq, name, len(data))

    async def sweep(self, older_than_s: float = ORPHAN_AGE_S) -> list[str]:
        """Purge the chunks that no object names and whose last one is older than
        `older_than_s` (uploads cut short by a kill or a timeout); their ids."""
        store = await self._open()
        stream = f"OBJ_{self.bucket}"
        chunks = f"$O.{self.bucket}.C."
        try:
            named = {i.nuid for i in await store.list(ignore_deletes=True) if not i.deleted}
        except NotFoundError:  # no object at all
            named = set()
        info = await self.js.stream_info(stream, subjects_filter=f"{chunks}>")
        swept = []
        now = datetime.now(UTC)
        for subject in sorted(info.state.subjects or {}):
            nuid = subject.removeprefix(chunks)
            if nuid in named:
                continue
            last = await self.js.get_last_msg(stream, subject)
            if now - _stored_at(last.time) < timedelta(seconds=older_than_s):
                continue  # maybe an upload under way
            await self.js.purge_stream(stream, subject=subject)
            swept.append(nuid)
        if swept:
            log.info("swept the chunks of %d cut upload(s) from %s", len(swept), self.bucket)
        return swept


def _stored_at(stamp: object) -> datetime:
    """A message's JetStream timestamp (RFC 3339 with nanoseconds, or a datetime); the
    epoch where it cannot be read (the chunks are then old enough to sweep)."""
    if isinstance(stamp, datetime):
        return stamp
    text = str(stamp or "")
    match = re.match(r"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(\.\d+)?(Z|[+-]\d\d:\d\d)$", text)
    if match is None:
        return datetime.fromtimestamp(0, UTC)
    fraction = (match.group(2) or ".0")[:7]
    zone = "+00:00" if match.group(3) == "Z" else match.group(3)
    return datetime.fromisoformat(match.group(1) + fraction + zone)

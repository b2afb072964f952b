"""A service starts from its newest snapshot it can trust and writes one now and then.

Restart time then grows with the events since the last snapshot, not with history. The snapshot is `fold(log[:seq])` itself (`gpuloom.state.snapshot`
encodes it), so starting from it and folding the rest of the log gives the state a
replay from sequence 1 gives: the decisions are the same.

Nothing here may stop a service: a snapshot that cannot be listed, read or trusted
(damaged, truncated, written by a version with another state schema) is skipped with
one log line, and the service falls back to an older one or to a full replay; a write
that fails is logged and tried again later. Serializing the state to JSON runs on the
event loop between two decisions (the state must not change under it; it is bounded
by the live cluster, so the pause is too); compressing and checksumming it (a good
part of the cost) runs in a thread, and the upload beside the
loop, one at a time.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from gpuloom.bus.errors import BucketNotFound
from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.state import ClusterState
from gpuloom.state.snapshot import (
    SnapshotError,
    decode_snapshot,
    pack_snapshot,
    serialize_state,
)
from gpuloom.telemetry.metrics import (
    SNAPSHOT_BYTES,
    SNAPSHOT_ENCODE_SECONDS,
    SNAPSHOT_RESTORED_SEQ,
    SNAPSHOT_SEQ,
)

log = logging.getLogger(__name__)

#: How long a stopping service waits for its last snapshot to be stored.
FINAL_WRITE_TIMEOUT_S = 10.0
#: While a process replays the log, a snapshot this often, seconds (`Snapshotter.due`).
REPLAY_EVERY_S = 60.0


class LogGapError(RuntimeError):
    """The log no longer holds the events after the state this process could restore."""


def check_no_gap(service: str, state_seq: int, first_seq: int) -> None:
    """Refuse to fold a log from its middle: once its start was dropped, a process needs
    a snapshot at the dropped point or later (its own, or the base snapshot)."""
    if first_seq > state_seq + 1:
        raise LogGapError(
            f"{service}: the log starts at seq {first_seq} (older events were dropped) and "
            f"no snapshot at seq {first_seq - 1} or later could be read; it will not fold "
            "a log from its middle (see docs/operations.md, the log's size)"
        )


@dataclass(frozen=True, slots=True)
class SnapshotPolicy:
    """When to write: after `every_events` folded events, or `every_s` seconds after the
    last snapshot if anything was folded since; 0 turns that trigger off."""

    every_events: int = 10_000
    every_s: float = 300.0

    @property
    def enabled(self) -> bool:
        return self.every_events > 0 or self.every_s > 0


class Snapshotter:
    """One service's snapshots: restore at start, write when due, write at stop."""

    def __init__(
        self,
        store: SnapshotStore,
        policy: SnapshotPolicy,
        *,
        base: SnapshotStore | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.store = store
        #: The base snapshots (read only): where a process without its own starts once
        #: the log's start was dropped.
        self.base = base
        self.service = store.service
        self.policy = policy
        self.clock = clock
        self.written_seq = 0
        self.written_at = clock()
        self._upload: asyncio.Task[None] | None = None
        self._said_missing = False
        #: The log this process folds (`restore`'s `log_created`), named in each snapshot.
        self.log = ""
        #: How long the last encode paused the loop, seconds.
        self.encode_s = 0.0

    async def restore(
        self, at_most: int | None = None, at_least: int = 0, log_created: str | None = None
    ) -> ClusterState | None:
        """The newest snapshot in [`at_least`, `at_most`] that decodes and matches its
        name: the process's own, else the base snapshot written when the log's start
        was dropped (`gpuloom archive drop`); None: replay the log from its start.

        `at_most`: none folded past this sequence: the log's end (a snapshot past it is
        of another log), or a projection's checkpoint (the rows of the events after it
        are still to be written, from their events). `at_least`: none older than the
        log's first sequence - 1 (the events after it are no longer in the log).
        `log_created`: when the log was created (`StreamFigures.created`): a snapshot of
        another log is skipped, and the snapshots written from now on name this one."""
        if log_created is not None:
            self.log = log_created
        for store, whose in ((self.store, "its"), (self.base, "the base")):
            if store is None:
                continue
            state = await self._newest(store, whose, at_most, at_least)
            if state is not None:
                return state
        log.info("%s has no usable snapshot: replaying the log from its start", self.service)
        SNAPSHOT_RESTORED_SEQ.labels(self.service).set(0)
        return None

    async def _newest(
        self, store: SnapshotStore, whose: str, at_most: int | None, at_least: int
    ) -> ClusterState | None:
        try:
            stored = await store.stored()
        except Exception as exc:
            log.warning("%s cannot list %s snapshots: %r", self.service, whose, exc)
            return None
        for snapshot in stored:
            if (at_most is not None and snapshot.seq > at_most) or snapshot.seq < at_least:
                log.info(
                    "%s passes over %s snapshot %s: outside seq %d..%s (the log's start, "
                    "its end or the checkpoint)",
                    self.service,
                    whose,
                    snapshot.name,
                    at_least,
                    at_most,
                )
                continue
            try:
                state = decode_snapshot(await store.read(snapshot), self.log or None)
            except SnapshotError as exc:
                log.warning("%s skips snapshot %s: %s", self.service, snapshot.name, exc)
                continue
            except Exception as exc:
                log.warning("%s cannot read snapshot %s: %r", self.service, snapshot.name, exc)
                continue
            if state.seq != snapshot.seq:
                log.warning(
                    "%s skips snapshot %s: it holds the state at seq %d",
                    self.service,
                    snapshot.name,
                    state.seq,
                )
                continue
            log.info(
                "%s starts from %s snapshot at seq %d (%d bytes, %d jobs); replaying from seq %d",
                self.service,
                whose,
                state.seq,
                snapshot.size,
                len(state.jobs),
                state.seq + 1,
            )
            if store is self.store:
                self.written_seq = state.seq
            SNAPSHOT_RESTORED_SEQ.labels(self.service).set(state.seq)
            return state
        return None

    def due(self, state: ClusterState, *, replaying: bool = False) -> bool:
        """Whether a snapshot is due. `replaying`: the process is still catching up
        with the log, folding thousands of events a second; then only every
        `REPLAY_EVERY_S` (a crash loses at most that much replay), since a snapshot
        every `every_events` would pause the replay for a few hundred milliseconds
        every two seconds."""
        if not self.policy.enabled or state.seq <= self.written_seq:
            return False
        elapsed = self.clock() - self.written_at
        if replaying:
            return elapsed >= REPLAY_EVERY_S
        events = self.policy.every_events
        seconds = self.policy.every_s
        return bool(
            (events > 0 and state.seq - self.written_seq >= events)
            or (seconds > 0 and elapsed >= seconds)
        )

    def maybe_write(self, state: ClusterState, *, replaying: bool = False) -> bool:
        """Encode `state` now and upload it in the background, when due and no upload
        is under way; True when it started one."""
        if not self.due(state, replaying=replaying) or (
            self._upload is not None and not self._upload.done()
        ):
            return False
        self._upload = asyncio.create_task(self._write(state.seq, self._serialize(state)))
        return True

    def _serialize(self, state: ClusterState) -> bytes:
        """The part of the encoding that reads the state: on the loop, timed (the pause)."""
        started = time.perf_counter()
        payload = serialize_state(state)
        self.encode_s = time.perf_counter() - started
        SNAPSHOT_ENCODE_SECONDS.labels(self.service).observe(self.encode_s)
        self.written_seq, self.written_at = state.seq, self.clock()  # tried: not again at once
        return payload

    async def _write(self, seq: int, payload: bytes) -> None:
        try:
            data = await asyncio.to_thread(pack_snapshot, payload, seq, self.log)
            await self.store.write(seq, data)
        except BucketNotFound:
            if not self._said_missing:
                self._said_missing = True
                log.warning(
                    "%s takes no snapshots: its bucket %s does not exist (the operator "
                    "creates it: `gpuloom bus setup`); a restart replays the log",
                    self.service,
                    self.store.bucket,
                )
            return
        except Exception as exc:  # the next one is due in `every_*`: a restart replays more
            log.warning("%s could not store its snapshot at seq %d: %r", self.service, seq, exc)
            return
        SNAPSHOT_SEQ.labels(self.service).set(seq)
        SNAPSHOT_BYTES.labels(self.service).set(len(data))
        log.info(
            "%s wrote its snapshot at seq %d (%d bytes; the loop paused %.1f ms to serialize it)",
            self.service,
            seq,
            len(data),
            self.encode_s * 1000,
        )

    async def close(self, state: ClusterState | None) -> None:
        """At a clean stop: wait for the upload under way, then store `state` if it is
        newer than the last snapshot (the next start replays nothing)."""
        try:
            if self._upload is not None:
                await asyncio.wait_for(self._upload, FINAL_WRITE_TIMEOUT_S)
            if state is not None and self.policy.enabled and state.seq > self.written_seq:
                seq, payload = state.seq, self._serialize(state)
                await asyncio.wait_for(self._write(seq, payload), FINAL_WRITE_TIMEOUT_S)
        except TimeoutError:
            log.warning("%s stopped before its last snapshot was stored", self.service)

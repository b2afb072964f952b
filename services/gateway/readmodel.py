"""What the gateway reads: its own fold of the log, and how far the SQL rows reach.

The rows (jobs, nodes) are written by the read-model writer, a process of its own
(`services.projector`): an array of 10,000 tasks is 30,000 row writes within seconds,
and while the gateway wrote them on the loop that answers requests, every other
user's reads waited behind them (issue #36). The gateway keeps a fold for the rules it
checks before it writes (quotas, limits, membership, visibility, explain), and learns
the writer's progress from its checkpoint in the database:

- `written_seq`: the checkpoint, read every `POLL_IDLE_S`, and every `POLL_WAITING_S`
  while a request waits for its own writes (`wait_for`);
- `state`: the gateway's fold, snapshots in the gateway's own bucket.

A read that must include the caller's writes waits for both (`wait_for`); one that
needs only the fold's verdict on an event waits for the fold (`wait_folded`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable

from sqlalchemy import func, select

from gpuloom.bus import EventBus
from gpuloom.decide.explain import Shared
from gpuloom.placement import BestFit, IndexCache
from gpuloom.runtime.follower import LogFollower
from gpuloom.runtime.projector import CHECKPOINT, PROJECTOR_BATCH, Progress
from gpuloom.runtime.snapshots import Snapshotter
from gpuloom.state.changes import ChangeFeed
from gpuloom.store.inline import ReadSessions
from gpuloom.store.models import ProjectionQuarantine
from gpuloom.store.upsert import load_checkpoint

log = logging.getLogger(__name__)

#: How often the writer's checkpoint is read when nobody waits for it (the lag header).
POLL_IDLE_S = 0.5
#: ... and while a request waits for its own writes to reach the rows.
POLL_WAITING_S = 0.02
#: Rows behind the fold for this long, without moving, are logged as a stalled writer.
STALLED_S = 30.0


class ReadModel(Progress):
    """The gateway's fold and the rows' checkpoint (module doc)."""

    def __init__(
        self,
        bus: EventBus,
        sessions: ReadSessions,
        *,
        name: str = CHECKPOINT,
        snapshots: Snapshotter | None = None,
    ) -> None:
        self.bus = bus
        self.sessions = sessions
        #: The projection whose checkpoint says how far the rows reach.
        self.name = name
        self.snapshots = snapshots
        #: What each folded event changed: the kept explaining index re-reads only that.
        self.changes = ChangeFeed()
        self.follower = LogFollower(bus, "gateway", observers=[self.changes], batch=PROJECTOR_BATCH)
        #: Rows up to this sequence are written (or quarantined) by the writer.
        self.written_seq = 0
        self._quarantined_rows = 0
        self.changed = asyncio.Condition()
        self._waiting = 0
        self._poll_now = asyncio.Event()
        #: What explaining pending jobs read last (the pass's inputs), kept for the next
        #: request: a job near the head of a long queue is then explained in a short walk.
        self.explaining = IndexCache(self.changes)
        #: The policy explain places with: one object, since the kept index is the one
        #: policy's (a new one would make it start afresh).
        self.explain_policy = BestFit()
        #: The last pass made for explaining, and the log position it was made at.
        self._explained: tuple[int, Shared] | None = None

    def explainer(self, wanted: Iterable[str]) -> Shared:
        """One scheduling pass on the fold, for the pending reasons of `wanted`.

        One pass per position of the fold: while nothing was folded since, a request
        about jobs the last pass decided reads that pass again, so a client polling a
        pending job (or many clients) costs the gateway one pass per change of the log,
        not one per request."""
        asked, state = frozenset(wanted), self.state
        last = self._explained
        if last is not None and last[0] == state.seq and last[1].state is state:
            shared = last[1]
            if shared.wanted is None or asked <= shared.wanted:
                return shared
            asked |= shared.wanted
        shared = Shared(state, self.explain_policy, kept=self.explaining, wanted=asked)
        self._explained = (state.seq, shared)
        return shared

    @property
    def quarantined(self) -> int:
        """Rows of this projection in the quarantine, as last read."""
        return self._quarantined_rows

    async def wait_for(self, seq: int, timeout: float) -> bool:
        """Wait until the rows and the fold both include `seq`; False on timeout."""
        return await self._wait(lambda: min(self.written_seq, self.state.seq) >= seq, timeout)

    async def wait_folded(self, seq: int, timeout: float) -> bool:
        """Wait until the gateway's fold includes `seq`; False on timeout."""
        return await self._wait(lambda: self.state.seq >= seq, timeout)

    async def _wait(self, reached: Callable[[], bool], timeout: float) -> bool:
        if reached():
            return True
        self._waiting += 1
        self._poll_now.set()

        async def until() -> None:
            async with self.changed:
                await self.changed.wait_for(reached)

        try:
            await asyncio.wait_for(until(), timeout)
        except TimeoutError:
            return False
        finally:
            self._waiting -= 1
        return True

    async def _notify(self) -> None:
        async with self.changed:
            self.changed.notify_all()

    async def read_checkpoint(self) -> None:
        """Read how far the writer has written (and what it quarantined)."""
        async with self.sessions() as session:
            written = await load_checkpoint(session, self.name)
            quarantined = await session.scalar(
                select(func.count())
                .select_from(ProjectionQuarantine)
                .where(ProjectionQuarantine.projection == self.name)
            )
        self._quarantined_rows = int(quarantined or 0)
        if written != self.written_seq:
            self.written_seq = written
            await self._notify()
        self._report()

    async def _watch_checkpoint(self, stop: asyncio.Event) -> None:
        """Read the checkpoint every `POLL_WAITING_S` while someone waits for it, every
        `POLL_IDLE_S` otherwise (never more often, however many wait)."""
        failing = False
        moved_at, moved_seq, warned = time.monotonic(), -1, False
        while not stop.is_set():
            try:
                await self.read_checkpoint()
                failing = False
                now = time.monotonic()
                if self.written_seq != moved_seq or self.written_seq >= self.state.seq:
                    moved_at, moved_seq, warned = now, self.written_seq, False
                elif now - moved_at > STALLED_S and not warned:
                    warned = True
                    log.warning(
                        "the SQL rows have stayed at seq %d for %.0f s while the log is at "
                        "%d: is the read-model writer (`gpuloom serve projector`) running?",
                        self.written_seq,
                        now - moved_at,
                        self.state.seq,
                    )
            except Exception as exc:  # the database is away: the reads say they lag
                if not failing:
                    log.warning("cannot read the read model's checkpoint: %r", exc)
                failing = True
            self._poll_now.clear()
            await asyncio.sleep(1.0 if failing else POLL_WAITING_S)
            if not self._waiting:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._poll_now.wait(), POLL_IDLE_S - POLL_WAITING_S)

    async def run(self, stop: asyncio.Event) -> None:
        watcher = asyncio.create_task(self._watch_checkpoint(stop))
        try:
            await self.follower.start(stop, self.snapshots, who="the gateway")
            await self._notify()
            log.info(
                "gateway folds from seq %d; rows written up to seq %d",
                self.state.seq + 1,
                self.written_seq,
            )
            while not stop.is_set():
                if await self.follower.fold_next(0.5):
                    await self._notify()
                    self._maybe_snapshot()
        finally:
            watcher.cancel()
            await asyncio.gather(watcher, return_exceptions=True)
            await self.follower.close()
            if self.snapshots is not None:
                caught_up = self.follower.is_caught_up()
                await self.snapshots.close(self.state if caught_up else None)

    def _maybe_snapshot(self) -> None:
        if self.snapshots is not None:
            self.snapshots.maybe_write(
                self.state, replaying=self.state.seq < self.follower.catch_up_seq
            )

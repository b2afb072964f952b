"""The webhooks process's own fold of the log: which webhooks exist (and whether they
deliver), who owns each job, the accounts. A `LogFollower` from its newest snapshot,
as every process that keeps a state (`gpuloom.runtime.follower`); the outbox waits for
it to hold an event before it decides who gets the event (`wait_for`)."""

from __future__ import annotations

import asyncio
import logging

from gpuloom.bus import EventBus
from gpuloom.runtime.follower import LogFollower
from gpuloom.runtime.snapshots import Snapshotter
from gpuloom.state import ClusterState

log = logging.getLogger(__name__)

#: The name it folds, dead-letters and snapshots under (its bus identity's).
SERVICE = "webhooks"


class Fold:
    def __init__(self, bus: EventBus, snapshots: Snapshotter | None = None) -> None:
        self.follower = LogFollower(bus, SERVICE)
        self.snapshots = snapshots
        self.changed = asyncio.Condition()
        #: Set once the state holds the log as it was at start (every webhook then
        #: registered is known).
        self.caught_up = asyncio.Event()

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    async def wait_for(self, seq: int, timeout: float) -> bool:
        """Wait until the state holds the events up to `seq`; False on timeout."""

        async def reached() -> None:
            async with self.changed:
                await self.changed.wait_for(lambda: self.state.seq >= seq)

        try:
            await asyncio.wait_for(reached(), timeout)
        except TimeoutError:
            return False
        return True

    async def run(self, stop: asyncio.Event) -> None:
        """Fold until `stop`; a snapshot when due, and one at a clean stop."""
        await self.follower.start(stop, self.snapshots)
        log.info(
            "webhooks folds the log from seq %d up to seq %d",
            self.state.seq + 1,
            self.follower.catch_up_seq,
        )
        try:
            while not stop.is_set():
                folded = await self.follower.fold_next(0.5)
                if self.state.seq >= self.follower.catch_up_seq and not self.caught_up.is_set():
                    log.info("webhooks caught up at seq %d", self.state.seq)
                    self.caught_up.set()
                if folded == 0:
                    continue
                async with self.changed:
                    self.changed.notify_all()
                if self.snapshots is not None:
                    replaying = self.state.seq < self.follower.catch_up_seq
                    self.snapshots.maybe_write(self.state, replaying=replaying)
        finally:
            await self.follower.close()
            if self.snapshots is not None:
                await self.snapshots.close(self.state)

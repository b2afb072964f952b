"""The read-model writer's projector: fold the log and keep the jobs and nodes tables
in step. It runs in a process of its own (`services.projector`); the gateway answers
reads from the rows and learns how far they reach from the checkpoint
(`services.gateway.readmodel`).

It folds the whole log with the one fold (so a row is exactly what every other
service believes), remembers which jobs and nodes each event touched, and after
each batch writes those rows and the checkpoint in one transaction. Events at or
below the stored checkpoint are folded but not written again: a restart rebuilds
the state and resumes writing where it stopped; an empty database is rebuilt
from sequence 1.

A row the database refuses (a NUL on PostgreSQL, a value out of its column's
range) is quarantined (`gpuloom.store.quarantine`) and the projection goes on;
the job or node is tried again when a later event changes it. The row mappers
are parameters so that a test can make the database refuse a row for real.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from collections.abc import Callable
from functools import partial
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus.messages import INBOX_LIMIT, Incoming
from gpuloom.bus.port import Log
from gpuloom.events import JobEvent, NodeEvent, NodeRemoved, Recorded
from gpuloom.runtime.follower import LogFollower
from gpuloom.runtime.snapshots import Snapshotter
from gpuloom.state import ClusterState, Folded, JobState, NodeState
from gpuloom.store import rows
from gpuloom.store.models import Base, JobRow, NodeRow
from gpuloom.store.quarantine import Item, describe, load_quarantined, upsert_items, write_batch
from gpuloom.store.upsert import load_checkpoint
from gpuloom.telemetry.metrics import PROJECTION_LAG, PROJECTION_QUARANTINED

log = logging.getLogger(__name__)

#: The rows' checkpoint, named when the gateway wrote them (kept: a database keeps it).
CHECKPOINT = "gateway.jobs_nodes"
#: Events folded between two writes (and by the gateway's fold between two answers).
PROJECTOR_BATCH = 250
#: Rows written in one transaction (`Projector._flush`).
ROWS_PER_WRITE = 500

JobMapper = Callable[[JobState, ClusterState], dict[str, Any]]
NodeMapper = Callable[[NodeState, ClusterState], dict[str, Any]]


class Progress(ABC):
    """How far a projection of the log has come, as its writer and the gateway report
    it: the fold's state, the log's end as last seen, the rows written, the lag."""

    bus: Log
    follower: LogFollower
    #: The projection (its checkpoint's name, the metrics' label).
    name: str
    #: Rows up to this sequence are written (or quarantined).
    written_seq: int

    @property
    @abstractmethod
    def quarantined(self) -> int:
        """Rows of this projection now in the quarantine."""

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    @property
    def stream_seq(self) -> int:
        """The log's last sequence as last seen (deliveries, `lag_behind_stream`)."""
        return self.follower.stream_seq

    @stream_seq.setter
    def stream_seq(self, seq: int) -> None:
        self.follower.stream_seq = seq

    @property
    def lag(self) -> int:
        """Events of the log, as last seen, not yet both folded and written."""
        return max(0, self.stream_seq - min(self.written_seq, self.state.seq))

    async def lag_behind_stream(self) -> int:
        """The lag, after asking the stream for its last sequence."""
        self.stream_seq = max(self.stream_seq, await self.bus.last_seq())
        self._report()
        return self.lag

    def _report(self) -> None:
        PROJECTION_LAG.labels(self.name).set(self.lag)
        PROJECTION_QUARANTINED.labels(self.name).set(self.quarantined)


def removed_row(node: NodeState, state: ClusterState) -> dict[str, Any]:
    """The last row of a removed node (NodeRemoved): the node as it was, `removed`."""
    return {**rows.node_row(node, state), "state": "removed"}


class Projector(Progress):
    def __init__(
        self,
        bus: Log,
        sessions: async_sessionmaker[Any],
        *,
        job_row: JobMapper = rows.job_row,
        node_row: NodeMapper = rows.node_row,
        name: str = CHECKPOINT,
        snapshots: Snapshotter | None = None,
        inbox_limit: int = INBOX_LIMIT,
        service: str = "projector",
    ) -> None:
        self.bus = bus
        #: Start from a snapshot of the fold not past the checkpoint, and write some.
        self.snapshots = snapshots
        self.sessions = sessions
        self.name = name
        self.job_row = job_row
        self.node_row = node_row
        self.follower = LogFollower(
            bus, service, observers=[self], inbox_limit=inbox_limit, batch=PROJECTOR_BATCH
        )
        #: Rows up to this sequence are written (or quarantined).
        self.written_seq = 0
        self._checkpoint = 0
        self._quarantined: set[tuple[str, str]] = set()
        self._touched_jobs: list[str] = []
        self._touched_nodes: list[str] = []
        self._held: dict[str, JobState] = {}
        self._dirty_jobs: set[str] = set()
        self._dirty_nodes: set[str] = set()
        #: Dirty jobs the fold forgot since the last flush (final and charged,
        #: `gpuloom.state.retention`): their last state, for their final row.
        self._gone: dict[str, JobState] = {}
        #: Nodes the event may remove (NodeRemoved), as they were before it, and the
        #: dirty ones removed since the last flush: their last row says `removed`.
        self._held_node: NodeState | None = None
        self._gone_nodes: dict[str, NodeState] = {}
        self.changed = asyncio.Condition()

    @property
    def quarantined(self) -> int:
        return len(self._quarantined)

    def before(self, recorded: Recorded) -> None:
        """Note the rows the event touches as they are before it (the nodes a job held)."""
        state, event = self.state, recorded.event
        self._touched_nodes = []
        self._touched_jobs = []
        if isinstance(event, JobEvent):
            self._touched_jobs.append(event.job_id)
            self._touched_jobs.extend(sorted(state.dependents.get(event.job_id, ())))
            before = state.jobs.get(event.job_id)
            if before is not None and before.array_id is not None:  # waiting on the array
                self._touched_jobs.extend(sorted(state.dependents.get(before.array_id, ())))
            if before is not None:
                self._touched_nodes.extend(sorted(before.nodes_held()))
        elif isinstance(event, NodeEvent):
            self._touched_nodes.append(event.node)
            self._touched_jobs.extend(state.on_node.get(event.node, ()))
        self._held_node = state.nodes.get(event.node) if isinstance(event, NodeRemoved) else None
        self._held = {j: job for j in self._touched_jobs if (job := state.jobs.get(j)) is not None}

    def after(self, message: Incoming, recorded: Recorded, folded: Folded) -> None:
        """Mark the rows the event touched, as they are after it, for the next flush."""
        state, event, seq = self.state, recorded.event, recorded.seq
        for job_id, job in self._held.items():
            if job_id not in state.jobs and seq > self._checkpoint:
                self._gone[job_id] = job  # it left the state with this event
        held_node, self._held_node = self._held_node, None
        if held_node is not None and held_node.name not in state.nodes:
            self._gone_nodes[held_node.name] = held_node
        if isinstance(event, JobEvent):
            after = state.jobs.get(event.job_id)
            if after is not None:
                self._touched_nodes.extend(sorted(after.nodes_held()))
            else:  # an array's id: its submission or cancellation touches every task
                self._touched_jobs.extend(state.array_tasks(event.job_id))
        if seq > self._checkpoint:
            self._dirty_jobs.update(self._touched_jobs)
            self._dirty_nodes.update(self._touched_nodes)
        self._held = {}

    def _item(
        self, kind: str, key: str, seq: int, model: type[Base], row: Callable[[], dict[str, Any]]
    ) -> Item:
        """The item of one row; a row that cannot be computed is quarantined, not retried."""
        try:
            return Item(kind, key, seq, ((model, row()),))
        except Exception as exc:
            log.exception("projector could not compute the %s row of %s", kind, key)
            return Item(kind, key, seq, (), error=f"row not computed: {describe(exc)}")

    def _job_items(self, job_ids: list[str]) -> list[Item]:
        state = self.state
        return [
            self._item("job", j, job.last_seq, JobRow, partial(self.job_row, job, state))
            for j in job_ids
            if (job := state.jobs.get(j) or self._gone.get(j)) is not None
        ]

    def _node_items(self) -> list[Item]:
        state = self.state
        items = [
            self._item("node", n, state.seq, NodeRow, partial(self.node_row, node, state))
            for n in sorted(self._dirty_nodes)
            if (node := state.nodes.get(n)) is not None
        ]
        items += [
            self._item("node", n, state.seq, NodeRow, partial(removed_row, node, state))
            for n in sorted(self._dirty_nodes)
            if n not in state.nodes and (node := self._gone_nodes.get(n)) is not None
        ]
        return items

    async def _flush(self) -> None:
        """Write the dirty rows, at most `ROWS_PER_WRITE` a transaction, and the
        checkpoint with the last (an array's submission touches 10,000 rows at once:
        one transaction would hold the database's write lock for all of them). A crash between two loses nothing:
        rows are upserts, and the checkpoint moves only with the last."""
        seq = self.state.seq
        if seq > self._checkpoint:
            jobs = sorted(self._dirty_jobs)
            chunks = [jobs[i : i + ROWS_PER_WRITE] for i in range(0, len(jobs), ROWS_PER_WRITE)]
            for chunk in chunks[:-1]:
                await self._write(self._job_items(chunk))
                await asyncio.sleep(0)
            last = chunks[-1] if chunks else []
            await self._write(self._job_items(last) + self._node_items(), seq)
            self._checkpoint = seq
        self._dirty_jobs.clear()
        self._dirty_nodes.clear()
        self._gone.clear()
        self._gone_nodes.clear()
        self.written_seq = seq
        self._report()
        async with self.changed:
            self.changed.notify_all()

    async def _write(self, items: list[Item], seq: int | None = None) -> None:
        """Write `items` (and move the checkpoint to `seq`; None: leave it)."""
        checkpoint = self._checkpoint if seq is None else seq
        refused = await write_batch(
            self.sessions, self.name, items, upsert_items, checkpoint, self._quarantined
        )
        self._quarantined.difference_update(item.entry_key for item in items)
        for entry in refused:
            self._quarantined.add(entry.item.entry_key)
            log.error(
                "projector quarantined %s %s (seq %d): %s",
                entry.item.kind,
                entry.item.entry_key[1],
                entry.item.seq,
                entry.error,
            )

    async def _try_flush(self) -> None:
        try:
            await self._flush()
        except Exception:  # the database is away: keep the dirty rows, retry on the next round
            log.exception("projector could not write rows up to seq %d", self.state.seq)
            self._report()
            await asyncio.sleep(1.0)

    async def wait_for(self, seq: int, timeout: float) -> bool:
        """Wait until rows up to `seq` are written (read-your-writes); False on timeout."""

        async def reached() -> None:
            async with self.changed:
                await self.changed.wait_for(lambda: self.written_seq >= seq)

        try:
            await asyncio.wait_for(reached(), timeout)
        except TimeoutError:
            return False
        return True

    async def _load(self, stop: asyncio.Event) -> bool:
        """Read the checkpoint and the quarantine, waiting for the database; False: stopped."""
        while not stop.is_set():
            try:
                async with self.sessions() as session:
                    self._checkpoint = await load_checkpoint(session, self.name)
                    self._quarantined = await load_quarantined(session, self.name)
                return True
            except Exception:  # the database is away (or not migrated yet): not ready
                log.exception("projector cannot read its checkpoint; retrying")
                await asyncio.sleep(1.0)
        return False

    async def run(self, stop: asyncio.Event) -> None:
        if not await self._load(stop):
            return
        await self.follower.start(
            stop, self.snapshots, at_most=self._checkpoint, who="the read-model writer"
        )
        self.written_seq = self._checkpoint
        log.info(
            "projector folds from seq %d and resumes writing after seq %d",
            self.state.seq + 1,
            self._checkpoint,
        )
        try:
            while not stop.is_set():
                if await self.follower.fold_next(0.5) == 0:
                    if self.state.seq > self.written_seq:
                        await self._try_flush()
                    continue
                await self._try_flush()
                self._maybe_snapshot()
        finally:
            await self.follower.close()
            if self.snapshots is not None:
                await self.snapshots.close(self.state if self._snapshot_fits() else None)

    def _snapshot_fits(self) -> bool:
        """A snapshot is of use only up to the checkpoint (`Snapshotter.restore`)."""
        return self.state.seq <= self._checkpoint

    def _maybe_snapshot(self) -> None:
        if self.snapshots is not None and self._snapshot_fits():
            self.snapshots.maybe_write(
                self.state, replaying=self.state.seq < self.follower.catch_up_seq
            )

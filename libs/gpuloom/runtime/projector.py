"""The gateway's projector: fold the log and keep the jobs and nodes tables in step.

It folds the whole log with the one fold (so a row is exactly what every other
service believes), remembers which jobs and nodes each event touched, and after
each batch writes those rows and the checkpoint in one transaction. Events at or
below the stored checkpoint are folded but not written again: a restart rebuilds
the state and resumes writing where it stopped; an empty database is rebuilt
from sequence 1.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus import EventBus, Incoming
from gpuloom.events import JobEvent, MalformedEvent, NodeEvent, decode
from gpuloom.state import ClusterState, apply
from gpuloom.store.models import JobRow, NodeRow
from gpuloom.store.rows import job_row, node_row
from gpuloom.store.upsert import load_checkpoint, save_checkpoint, upsert_newer

log = logging.getLogger(__name__)

CHECKPOINT = "gateway.jobs_nodes"
BATCH = 2000


class Projector:
    def __init__(self, bus: EventBus, sessions: async_sessionmaker[Any]) -> None:
        self.bus = bus
        self.sessions = sessions
        self.state = ClusterState()
        self.written_seq = 0
        self._checkpoint = 0
        self._inbox: asyncio.Queue[Incoming] = asyncio.Queue()
        self._dirty_jobs: set[str] = set()
        self._dirty_nodes: set[str] = set()
        self.changed = asyncio.Condition()

    async def _enqueue(self, message: Incoming) -> None:
        self._inbox.put_nowait(message)

    def _fold(self, message: Incoming) -> None:
        try:
            recorded = decode(message.seq, message.body)
        except MalformedEvent as exc:
            log.error("projector skipping malformed event: %s", exc)
            self.state.seq = max(self.state.seq, message.seq)
            return
        event = recorded.event
        touched_nodes: list[str] = []
        touched_jobs: list[str] = []
        if isinstance(event, JobEvent):
            touched_jobs.append(event.job_id)
            touched_jobs.extend(sorted(self.state.dependents.get(event.job_id, ())))
            before = self.state.jobs.get(event.job_id)
            if before is not None:
                touched_nodes.extend(sorted(before.nodes_held()))
        elif isinstance(event, NodeEvent):
            touched_nodes.append(event.node)
            touched_jobs.extend(self.state.on_node.get(event.node, ()))
        apply(self.state, recorded)
        if isinstance(event, JobEvent):
            after = self.state.jobs.get(event.job_id)
            if after is not None:
                touched_nodes.extend(sorted(after.nodes_held()))
        if message.seq > self._checkpoint:
            self._dirty_jobs.update(touched_jobs)
            self._dirty_nodes.update(touched_nodes)

    async def _flush(self) -> None:
        jobs = [
            job_row(self.state.jobs[j], self.state)
            for j in sorted(self._dirty_jobs)
            if j in self.state.jobs
        ]
        nodes = [
            node_row(self.state.nodes[n], self.state)
            for n in sorted(self._dirty_nodes)
            if n in self.state.nodes
        ]
        seq = self.state.seq
        if seq > self._checkpoint:
            async with self.sessions.begin() as session:
                if jobs:
                    await upsert_newer(session, JobRow, jobs, ["id"])
                if nodes:
                    await upsert_newer(session, NodeRow, nodes, ["name"])
                await save_checkpoint(session, CHECKPOINT, seq)
            self._checkpoint = seq
        self._dirty_jobs.clear()
        self._dirty_nodes.clear()
        self.written_seq = seq
        async with self.changed:
            self.changed.notify_all()

    async def _try_flush(self) -> None:
        try:
            await self._flush()
        except Exception:  # the database is away: keep the dirty rows, retry on the next round
            log.exception("projector could not write rows up to seq %d", self.state.seq)
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

    async def run(self, stop: asyncio.Event) -> None:
        async with self.sessions() as session:
            self._checkpoint = await load_checkpoint(session, CHECKPOINT)
        self.written_seq = self._checkpoint
        log.info("projector resumes writing after seq %d", self._checkpoint)
        unsubscribe = await self.bus.follow(self._enqueue)
        try:
            while not stop.is_set():
                try:
                    first = await asyncio.wait_for(self._inbox.get(), 0.5)
                except TimeoutError:
                    if self.state.seq > self.written_seq:
                        await self._try_flush()
                    continue
                message: Incoming | None = first
                count = 0
                while message is not None and count < BATCH:
                    self._fold(message)
                    count += 1
                    message = None if self._inbox.empty() else self._inbox.get_nowait()
                if message is not None:
                    self._fold(message)
                await self._try_flush()
        finally:
            await unsubscribe()

"""The agent's state: the view of its nodes, followed from the view stream.

The agent does not read the log (it holds every job's command and environment): it
follows its nodes' subjects of the view stream, which the dispatch process writes
(`gpuloom.state.nodeview`), with one pull consumer per node, named after it (the only
consumers its identity may create, two names per node:
`gpuloom.bus.identities.agent_permissions`). `ViewFollower` is the
Reactor's source of state in place of the fold of the log:

- caught up at start once every node's view is complete up to the log's last
  sequence as it was then (the agent may read that number, not the log);
- after the agent writes (JobStarted, JobFinished), caught up again once the view of
  each node it wrote for is complete up to its write: the dispatcher sends a node a
  position after every event its agent wrote;
- where a node's view lags what the agent waits for (at start, after a cut-off, the
  dispatcher restarting), it asks the dispatcher to confirm it (`sync_subject`), once
  a second while it lags.

A message it cannot read (another version's record, a damaged one) is logged and
skipped: it changes nothing in the view.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from gpuloom.bus.messages import Incoming
from gpuloom.bus.port import Bus
from gpuloom.bus.streams import view_stream
from gpuloom.events.subjects import sync_subject, view_consumers, view_subjects
from gpuloom.runtime.snapshots import Snapshotter
from gpuloom.state import ClusterState
from gpuloom.state.nodeview import (
    KIND_HEADER,
    NodeView,
    RecordError,
    decode_record,
    decode_seq,
)

log = logging.getLogger(__name__)

#: How often a lagging node's view is asked for again.
SYNC_EVERY_S = 1.0
#: View messages held delivered but not yet taken.
INBOX_LIMIT = 10_000
#: Trace headers a record carries over from the event that last changed its job.
TRACE_HEADERS = ("traceparent", "tracestate")


class ViewFollower:
    """The view of `nodes` as a Reactor's state (`gpuloom.runtime.reactor.Follower`)."""

    source = "the view of its nodes"

    def __init__(self, bus: Bus, nodes: Sequence[str]) -> None:
        self.bus = bus
        self.view = NodeView(nodes)
        self.views = bus.on_stream(view_stream(bus.stream))
        #: The log's last sequence at start: every node's view must reach it.
        self.catch_up_seq = 0
        self._target = 0
        #: node -> the latest sequence this agent wrote for it.
        self._awaited: dict[str, int] = {}
        #: node -> when its view was last asked for (time.monotonic()).
        self._asked: dict[str, float] = {}
        self._pending: dict[str, int] = {}
        self._inbox: asyncio.Queue[Incoming] = asyncio.Queue(INBOX_LIMIT)
        self._traces: dict[str, dict[str, str]] = {}
        self._stops: list[Callable[[], Awaitable[None]]] = []
        self._stopper: asyncio.Task[bool] | None = None
        self.skipped = 0

    @property
    def state(self) -> ClusterState:
        return self.view.state

    async def start(
        self, stop: asyncio.Event, snapshots: Snapshotter | None = None, *, at_most: int | None
    ) -> None:
        """Follow every node's view from its start (the latest of each subject)."""
        self.catch_up_seq = await self.bus.last_seq()
        self.sync_to(self.catch_up_seq)
        self._stopper = asyncio.create_task(stop.wait())
        for node in self.view.positions:
            self._stops.append(
                await self.views.follow(
                    self._inbox.put,
                    from_seq=1,
                    subjects=view_subjects(node),
                    consumer=view_consumers(node)[0],
                )
            )
        await self._ask()

    async def close(self) -> None:
        if self._stopper is not None:
            self._stopper.cancel()
        for stop in self._stops:
            await stop()

    def complete_seq(self) -> int:
        """How far the view of every node reaches (the least position)."""
        return min(self.view.positions.values())

    def sync_to(self, seq: int) -> None:
        """Every node's view must be complete up to `seq` before the agent decides."""
        self._target = max(self._target, seq)

    # --- taking messages ----------------------------------------------------------

    async def fold_next(self, timeout: float | None) -> int:
        """Take the next view message (waiting up to `timeout`) and those behind it."""
        assert self._stopper is not None, "start() first"
        getter = asyncio.create_task(self._inbox.get())
        done, _ = await asyncio.wait(
            {getter, self._stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        count = 0
        if getter in done:
            message: Incoming | None = getter.result()
            while message is not None:
                self.take(message)
                count += 1
                try:
                    message = self._inbox.get_nowait()
                except asyncio.QueueEmpty:
                    message = None
        else:
            getter.cancel()
        await self._ask()
        return count

    def take(self, message: Incoming) -> None:
        """Apply one view message (`gpuloom.view.<node>.job.<id>` or `.position`)."""
        parts = message.subject.split(".")
        node = parts[2] if len(parts) >= 4 else ""
        self._pending[node] = message.pending
        kind = message.headers.get(KIND_HEADER, "")
        try:
            if kind == "record" and len(parts) == 5 and parts[3] == "job":
                job = decode_record(message.body, message.headers)
                if self.view.take(node, job):
                    trace = {k: v for k, v in message.headers.items() if k in TRACE_HEADERS}
                    self._traces[f"job.{job.job_id}"] = trace
            elif kind == "gone" and len(parts) == 5 and parts[3] == "job":
                dropped = self.view.drop(node, parts[4], decode_seq(message.body))
                if dropped and parts[4] not in self.view.state.jobs:
                    self._traces.pop(f"job.{parts[4]}", None)
            elif kind == "position" and len(parts) == 4 and parts[3] == "position":
                self.view.advance(node, decode_seq(message.body))
            else:
                raise RecordError(f"unknown view message {kind!r}")
        except RecordError as exc:
            self.skipped += 1
            log.error("view message %s (seq %d) skipped: %s", message.subject, message.seq, exc)

    # --- where it stands ------------------------------------------------------------

    def _wanted(self, node: str) -> int:
        return max(self._target, self._awaited.get(node, 0))

    def is_caught_up(self) -> bool:
        """Every node's view reaches the log's start sequence and this agent's writes,
        and nothing more waits to be taken."""
        if not self._inbox.empty() or any(self._pending.values()):
            return False
        return all(self.view.complete(node, self._wanted(node)) for node in self.view.positions)

    def wrote(self, written: Sequence[tuple[str, int]]) -> None:
        """This agent published these (subject, sequence): its node's view must show them."""
        now = time.monotonic()
        for subject, seq in written:
            node = subject.split(".")[-1]
            if node in self.view.positions and seq > self._awaited.get(node, 0):
                self._awaited[node] = seq
                # the dispatcher sends a position after it anyway: ask only if it lags
                self._asked[node] = now

    def trace_context(self, aggregate: str) -> dict[str, str] | None:
        return self._traces.get(aggregate)

    async def _ask(self) -> None:
        """Ask the dispatcher to confirm each lagging node's view (once a second)."""
        now = time.monotonic()
        for node in self.view.positions:
            wanted = self._wanted(node)
            last = self._asked.get(node)
            if self.view.complete(node, wanted) or (last is not None and now - last < SYNC_EVERY_S):
                continue
            self._asked[node] = now
            try:
                await self.bus.send(sync_subject(node), json.dumps({"seq": wanted}).encode())
            except Exception as exc:  # reconnecting: asked again next round
                log.warning("cannot ask for the view of %s: %s", node, exc)

"""Composition root of the dispatch service: each node's jobs, to that node alone.

Agents do not read the log (every job's command and environment are in it); they
read the view of their nodes (`gpuloom.state.nodeview`), which this service writes.
It folds the log as every service does (snapshots, dead letters) and, once caught up,
after each batch of events:

1. routes the jobs the batch changed (`nodeview.route`): the job as the fold holds it
   to each node that hosts it, a tombstone to each node it left;
2. writes a position (the sequence folded) to each node that got something, whose
   agent wrote an event in the batch, or whose agent asked up to a sequence now
   folded (`gpuloom.dispatch.sync.<node>`: at its start, after a cut-off).

When it starts (and after a write that failed) it writes the whole view again once
caught up: every job on a node, a tombstone for every record the view holds of a job
no longer there (what changed while it was down), a position for every node. Two
copies write the same records; a view takes nothing older than it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging

from gpuloom.bus import EventBus, Incoming
from gpuloom.bus.identities import check_token
from gpuloom.bus.messages import Outgoing, Received
from gpuloom.bus.streams import VIEW_TOMBSTONE_TTL_S, view_stream
from gpuloom.config import Settings
from gpuloom.events import Recorded
from gpuloom.events.subjects import (
    SYNC_PREFIX,
    VIEW_PREFIX,
    agent_node_of,
    view_job_subject,
    view_position_subject,
)
from gpuloom.runtime.follower import LogFollower
from gpuloom.runtime.reactor import TraceContexts
from gpuloom.runtime.service import run_service, snapshotter
from gpuloom.runtime.snapshots import Snapshotter
from gpuloom.state import ClusterState, Folded
from gpuloom.state.changes import ChangeFeed
from gpuloom.state.nodeview import (
    Gone,
    Record,
    Route,
    encode_gone,
    encode_position,
    encode_record,
    everything,
    route,
)
from gpuloom.telemetry.metrics import SYNCS_REFUSED

log = logging.getLogger("services.dispatch")

#: How long the loop waits for events before it looks at the agents' requests.
IDLE_S = 0.25
#: How long to wait before writing the view again after a write failed (NATS away,
#: the view stream missing): one warning per try.
RETRY_S = 2.0
#: Most view messages published in one pipelined go.
PUBLISH_BATCH = 1000


class WritersSeen:
    """The nodes whose agents wrote an event (`agent_node_of` its subject) since the
    last routing: each gets a position, so that the agent knows its write is folded."""

    def __init__(self) -> None:
        self.nodes: set[str] = set()

    def before(self, recorded: Recorded) -> None:
        pass

    def after(self, message: Incoming, recorded: Recorded, folded: Folded) -> None:
        node = agent_node_of(message.subject)
        if node is not None:
            self.nodes.add(node)


class Dispatcher:
    """Routes the fold's jobs to the view stream (module doc)."""

    def __init__(self, bus: EventBus, snapshots: Snapshotter | None = None) -> None:
        self.views = bus.on_stream(view_stream(bus.stream))
        self.snapshots = snapshots
        self.writers = WritersSeen()
        self.traces = TraceContexts(lambda: self.state)
        #: What each event changed: routing reads only the jobs changed since it last did.
        self.changes = ChangeFeed()
        self.follower = LogFollower(
            bus, "dispatch", observers=[self.traces, self.writers, self.changes]
        )
        #: job id -> the nodes that hold its record.
        self.sent: dict[str, frozenset[str]] = {}
        #: The state's sequence when it last routed; None: write the whole view again.
        self.routed_seq: int | None = None
        #: node -> the sequence its agent asked its view to reach.
        self.asked: dict[str, int] = {}
        #: Sync requests refused (malformed) since start.
        self.refused_syncs = 0

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    def on_sync(self, msg: Received) -> None:
        """An agent asks that its node's view reach a sequence (body `{"seq": n}`)."""
        node = msg.subject.removeprefix(f"{SYNC_PREFIX}.")
        try:
            check_token("node", node)
            seq = json.loads(msg.data)["seq"]
            if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
                raise ValueError(f"bad sequence {seq!r}")
        except (ValueError, KeyError, TypeError) as exc:
            self.refused_syncs += 1  # logged at the 1st, 2nd, 4th, 8th...: a flood costs no disk
            SYNCS_REFUSED.inc()
            if self.refused_syncs & (self.refused_syncs - 1) == 0:
                log.warning(
                    "refused a sync request on %s (%d so far): %s",
                    msg.subject,
                    self.refused_syncs,
                    exc,
                )
            return
        self.asked[node] = max(self.asked.get(node, 0), seq)

    async def run(self, stop: asyncio.Event) -> None:
        await self.follower.start(stop, self.snapshots)
        log.info(
            "dispatch replaying the log from seq %d up to seq %d",
            self.state.seq + 1,
            self.follower.catch_up_seq,
        )
        try:
            while not stop.is_set():
                await self.follower.fold_next(IDLE_S)
                if stop.is_set() or not self.follower.is_caught_up():
                    continue
                try:
                    await self.dispatch()
                except Exception as exc:  # NATS away: write the whole view once it is back
                    log.warning("dispatch could not write the view: %r; writing it again", exc)
                    self.routed_seq = None
                    await asyncio.sleep(RETRY_S)
                    continue
                if self.snapshots is not None and self.snapshots.due(self.state):
                    self.snapshots.maybe_write(self.state)
        finally:
            await self.follower.close()
            if self.snapshots is not None:
                caught_up = self.follower.is_caught_up()
                await self.snapshots.close(self.state if caught_up else None)

    async def dispatch(self) -> None:
        """Route what changed since the last call (everything, the first time)."""
        state = self.state
        seq = state.seq
        if self.routed_seq is None:
            routes, extra = await self.rewrite()
        else:
            since = self.routed_seq
            changed = (
                self.changes.jobs_since(since)
                if self.changes.covers(state, since)
                else everything(state, self.sent)
            )
            routes = route(state, changed, self.sent)
            extra = set()
        nodes = {r.node for r in routes} | self.writers.nodes | extra
        nodes |= {node for node, wanted in self.asked.items() if wanted <= seq}
        if not routes and not nodes:
            self.routed_seq = seq
            return
        messages = [self.message(r) for r in routes]
        body, headers = encode_position(seq)
        messages += [Outgoing(view_position_subject(n), body, headers) for n in sorted(nodes)]
        for start in range(0, len(messages), PUBLISH_BATCH):
            await self.views.publish_acked(messages[start : start + PUBLISH_BATCH], timeout=30.0)
        self.writers.nodes.clear()
        for node in nodes:
            if self.asked.get(node, seq + 1) <= seq:
                del self.asked[node]
        self.routed_seq = seq

    async def rewrite(self) -> tuple[list[Route], set[str]]:
        """The whole view again: records of every job on a node, tombstones for the
        records the view holds of jobs no longer there, and every node to position."""
        state = self.state
        self.sent = {}
        routes = route(state, everything(state, {}), self.sent)
        live = {(r.node, r.job.job_id) for r in routes if isinstance(r, Record)}
        for node, job_id in await self.held():
            if (node, job_id) not in live:
                routes.append(Gone(node, job_id, state.seq))
        log.info("dispatch writes the whole view at seq %d: %d message(s)", state.seq, len(routes))
        return routes, set(state.nodes)

    async def held(self) -> list[tuple[str, str]]:
        """(node, job) of every record or tombstone in the view stream."""
        found = []
        for subject in await self.views.subjects(f"{VIEW_PREFIX}.*.job.*"):
            parts = subject.split(".")
            if len(parts) == 5:
                found.append((parts[2], parts[4]))
        return found

    def message(self, routed: Route) -> Outgoing:
        if isinstance(routed, Record):
            body, headers = encode_record(routed.job)
            trace = self.traces.by_aggregate.get(f"job.{routed.job.job_id}") or {}
            return Outgoing(
                view_job_subject(routed.node, routed.job.job_id), body, {**headers, **trace}
            )
        body, headers = encode_gone(routed)
        headers["Nats-TTL"] = f"{VIEW_TOMBSTONE_TTL_S}s"
        return Outgoing(view_job_subject(routed.node, routed.job_id), body, headers)


async def serve(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    dispatcher = Dispatcher(bus, snapshotter(settings, bus, "dispatch"))

    async def on_sync(msg: Received) -> None:
        dispatcher.on_sync(msg)

    unserve = await bus.serve(f"{SYNC_PREFIX}.*", on_sync)
    try:
        await dispatcher.run(stop)
    finally:
        with contextlib.suppress(Exception):
            await unserve()


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("dispatch", serve)


if __name__ == "__main__":
    entrypoint()

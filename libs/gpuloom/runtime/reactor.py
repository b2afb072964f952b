"""The loop every scheduling service runs: fold the log, decide when caught up, publish.

A `Reactor` folds the log with a `LogFollower` (from its newest snapshot, or from
sequence 1) and — only when it has folded everything the stream held and everything
it published itself — calls the service's decision function and publishes what it
returns. It is level triggered: after a crash it replays the log and decides again
from the rebuilt state, and msg-id de-duplication plus the fold's voiding make a
repeated decision harmless. Services differ only in the function they pass, and in
the projections they keep from the same fold (accounting's ledger).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Protocol

from opentelemetry.trace import SpanKind

from gpuloom.bus.messages import INBOX_LIMIT, Incoming, Outgoing
from gpuloom.bus.port import Log
from gpuloom.events import Decision, Recorded, encode, make_envelope, subject_for
from gpuloom.runtime.follower import FoldObserver, LogFollower
from gpuloom.runtime.snapshots import Snapshotter
from gpuloom.state import ClusterState, Folded
from gpuloom.telemetry import extract, inject, tracer
from gpuloom.telemetry.metrics import DECIDE_SECONDS, EVENTS_PUBLISHED

log = logging.getLogger(__name__)

Decide = Callable[[ClusterState], Awaitable[Sequence[Decision]]]


def pure(decide: Callable[[ClusterState], Sequence[Decision]]) -> Decide:
    """Adapt a pure decision function to the reactor's async signature."""

    async def run(state: ClusterState) -> Sequence[Decision]:
        return decide(state)

    return run


class Projection(FoldObserver, Protocol):
    """Rows a reactor keeps from its own fold, written in its loop (the accounting
    ledger: the charges the fold applied). The reactor starts from a snapshot no newer
    than what the projection has written, so every event after it is seen again."""

    #: Rows are written for every event up to this sequence.
    written_seq: int

    async def load(self, stop: asyncio.Event) -> bool:
        """Read where it stands (waiting for its database); False: stopped first."""

    def behind(self) -> bool:
        """Rows wait to be written (the reactor comes back soon to try again)."""

    async def flush(self, seq: int, *, force: bool) -> None:
        """Write what the events up to `seq` (all folded) made; with `force`, record
        `seq` as written even with no row to write. Never raises: a database that is
        away keeps the rows for the next call."""


class TraceContexts:
    """Each live aggregate's last trace context, so that a decision continues the trace
    of the request that caused it; forgotten with the job (bounded by the live state)."""

    def __init__(self, state: Callable[[], ClusterState]) -> None:
        self.state = state
        self.by_aggregate: dict[str, dict[str, str]] = {}

    def before(self, recorded: Recorded) -> None:
        pass

    def after(self, message: Incoming, recorded: Recorded, folded: Folded) -> None:
        key = _aggregate_key(message.subject)
        if "traceparent" in message.headers:
            self.by_aggregate[key] = {
                k: v for k, v in message.headers.items() if k in ("traceparent", "tracestate")
            }
        if key.startswith("job.") and key[4:] not in self.state().jobs:
            self.by_aggregate.pop(key, None)


class Follower(Protocol):
    """Where a reactor's state comes from: the fold of the log (`LogFollower`), or
    another source of a `ClusterState` (an agent's per-node view)."""

    #: What it reads, for the logs: "the log", "the view of its nodes".
    source: str
    catch_up_seq: int

    @property
    def state(self) -> ClusterState: ...

    async def start(
        self, stop: asyncio.Event, snapshots: Snapshotter | None = None, *, at_most: int | None
    ) -> object: ...

    async def fold_next(self, timeout: float | None) -> int: ...

    async def close(self) -> None: ...

    def wrote(self, written: Sequence[tuple[str, int]]) -> None: ...

    def is_caught_up(self) -> bool: ...

    def trace_context(self, aggregate: str) -> dict[str, str] | None: ...


class Reactor:
    def __init__(
        self,
        bus: Log,
        service: str,
        decide: Decide,
        *,
        tick_s: float | None = None,
        observers: Sequence[FoldObserver] = (),
        projections: Sequence[Projection] = (),
        publish_timeout_s: float = 10.0,
        snapshots: Snapshotter | None = None,
        inbox_limit: int = INBOX_LIMIT,
        follower: Follower | None = None,
    ) -> None:
        self.bus = bus
        self.service = service
        self.decide = decide
        self.tick_s = tick_s
        self.publish_timeout_s = publish_timeout_s
        self.snapshots = snapshots
        self.projections = tuple(projections)
        self.traces = TraceContexts(lambda: self.state)
        #: The fold of the log, unless another source is given (`observers` and
        #: `inbox_limit` are the fold's).
        self.follower: Follower = follower or LogFollower(
            bus,
            service,
            observers=[self.traces, *observers, *self.projections],
            inbox_limit=inbox_limit,
        )
        self._trace_context = (
            follower.trace_context if follower is not None else self.traces.by_aggregate.get
        )
        self._decided_at_seq = -1
        self._retry = False
        self._tracer = tracer(f"gpuloom.{service}")
        self.caught_up = asyncio.Event()

    @property
    def state(self) -> ClusterState:
        return self.follower.state

    def is_caught_up(self) -> bool:
        """Folded the log as it was at start, and every decision this process published."""
        return self.follower.is_caught_up()

    async def wait_for_seq(self, seq: int, timeout: float) -> bool:
        """Wait until the state has folded `seq` (read-your-writes); False on timeout."""
        deadline = time.monotonic() + timeout
        while self.state.seq < seq:
            if time.monotonic() >= deadline:
                return False
            await asyncio.sleep(0.005)
        return True

    # --- publishing ----------------------------------------------------------------

    def outgoing(self, decision: Decision) -> tuple[Outgoing, str]:
        event = decision.event
        key = f"{event.AGGREGATE}.{event.aggregate_id()}"
        parent = extract(self._trace_context(key))
        with self._tracer.start_as_current_span(
            f"{self.service} {event.TYPE}",
            context=parent,
            kind=SpanKind.PRODUCER,
            attributes={"gpuloom.aggregate": key, "gpuloom.event": event.TYPE},
        ):
            envelope = make_envelope(
                event,
                at=datetime.now(UTC),
                by=self.service,
                correlation_id=event.aggregate_id(),
                causation_id=decision.causation_id,
            )
            headers = inject({"Nats-Msg-Id": decision.msg_id})
        return Outgoing(subject_for(event), encode(envelope), headers), event.TYPE

    async def publish(self, decisions: Sequence[Decision]) -> int:
        """Publish decisions in order; the state will not be decided on again before it folds them."""
        if not decisions:
            return 0
        built = [self.outgoing(d) for d in decisions]
        messages = [m for m, _ in built]
        if len(messages) == 1:
            seq, _ = await self.bus.publish(messages[0], timeout=self.publish_timeout_s)
            seqs = [seq]
        else:
            seqs = await self.bus.publish_many(messages, timeout=self.publish_timeout_s)
        for _, event_type in built:
            EVENTS_PUBLISHED.labels(self.service, event_type).inc()
        self.follower.wrote([(m.subject, seq) for m, seq in zip(messages, seqs, strict=True)])
        return max(seqs)

    # --- the loop ------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        for projection in self.projections:
            if not await projection.load(stop):
                return
        written = [p.written_seq for p in self.projections]
        await self.follower.start(stop, self.snapshots, at_most=min(written, default=None))
        log.info(
            "%s reading %s from seq %d up to seq %d",
            self.service,
            self.follower.source,
            self.state.seq + 1,
            self.follower.catch_up_seq,
        )
        # restored at the log's end, nothing will arrive: look at the state at once
        look_now = self.state.seq >= self.follower.catch_up_seq
        try:
            while not stop.is_set():
                timeout, is_tick = (0, True) if look_now else self._timeout()
                look_now = False
                ticked = await self.follower.fold_next(timeout) == 0 and is_tick
                if stop.is_set():
                    break
                await self._flush(force=False)
                if not self.is_caught_up():
                    continue
                if not self.caught_up.is_set():
                    log.info("%s caught up at seq %d", self.service, self.state.seq)
                    self.caught_up.set()
                if self.state.seq != self._decided_at_seq or ticked:
                    await self._decide_and_publish()
                if self.snapshots is not None and self.snapshots.due(self.state):
                    await self._flush(force=True)  # after deciding: never delays a decision
                    if self._written():
                        self.snapshots.maybe_write(self.state)
        finally:
            await self.follower.close()
            caught_up = self.caught_up.is_set()
            if caught_up:
                await self._flush(force=True)
            if self.snapshots is not None:
                await self.snapshots.close(self.state if caught_up and self._written() else None)

    def _timeout(self) -> tuple[float | None, bool]:
        """How long to wait for the next event, and whether a wait that ends with none
        is a tick (decide again): a projection with rows to write only wakes the loop
        to write them."""
        if self._retry:
            return 0.5, True
        if any(p.behind() for p in self.projections):
            if self.tick_s is not None and self.tick_s <= 0.5:
                return self.tick_s, True
            return 0.5, False
        return self.tick_s, True

    async def _flush(self, *, force: bool) -> None:
        for projection in self.projections:
            await projection.flush(self.state.seq, force=force)

    def _written(self) -> bool:
        """Every projection wrote up to the state: a snapshot of it is of use at start."""
        return all(p.written_seq >= self.state.seq for p in self.projections)

    async def _decide_and_publish(self) -> None:
        started = time.perf_counter()
        self._decided_at_seq = self.state.seq
        try:
            decisions = await self.decide(self.state)
        except Exception:  # a bug in one decision must not take the service down
            log.exception("%s failed to decide at seq %d", self.service, self.state.seq)
            self._retry = True
            return
        DECIDE_SECONDS.labels(self.service).observe(time.perf_counter() - started)
        try:
            await self.publish(decisions)
        except Exception as exc:  # NATS down or slow: the same decisions come back next round
            log.warning("%s could not publish %d decisions: %s", self.service, len(decisions), exc)
            self._retry = True
        else:
            self._retry = False


def _aggregate_key(subject: str) -> str:
    """`gpuloom.evt.job.<id>.<Type>` -> `job.<id>`."""
    parts = subject.split(".")
    return f"{parts[2]}.{parts[3]}" if len(parts) >= 5 else subject

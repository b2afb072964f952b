"""The loop every scheduling service runs: fold the log, decide when caught up, publish.

A `Reactor` follows the whole stream from sequence 1 with an ordered consumer,
folds each event with the one pure fold, and — only when it has folded
everything the stream held and everything it published itself — calls the
service's decision function and publishes what it returns. It is level
triggered: after a crash it replays the log and decides again from the
rebuilt state, and msg-id de-duplication plus the fold's voiding make a
repeated decision harmless. Services differ only in the function they pass.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime

from opentelemetry.trace import SpanKind

from gpuloom.bus import EventBus, Incoming
from gpuloom.bus.jetstream import INBOX_LIMIT, Outgoing
from gpuloom.events import (
    Decision,
    MalformedEvent,
    Recorded,
    decode,
    encode,
    make_envelope,
    subject_for,
)
from gpuloom.runtime.snapshots import Snapshotter, check_no_gap
from gpuloom.state import ClusterState, apply
from gpuloom.telemetry import extract, inject, tracer
from gpuloom.telemetry.metrics import (
    DECIDE_SECONDS,
    EVENTS_FOLDED,
    EVENTS_PUBLISHED,
    EVENTS_VOIDED,
    MALFORMED,
    STATE_SEQ,
)

log = logging.getLogger(__name__)

Decide = Callable[[ClusterState], Awaitable[Sequence[Decision]]]
BATCH = 2000


def pure(decide: Callable[[ClusterState], Sequence[Decision]]) -> Decide:
    """Adapt a pure decision function to the reactor's async signature."""

    async def run(state: ClusterState) -> Sequence[Decision]:
        return decide(state)

    return run


class Reactor:
    def __init__(
        self,
        bus: EventBus,
        service: str,
        decide: Decide,
        *,
        tick_s: float | None = None,
        on_recorded: Callable[[Recorded], None] | None = None,
        publish_timeout_s: float = 10.0,
        snapshots: Snapshotter | None = None,
        inbox_limit: int = INBOX_LIMIT,
    ) -> None:
        self.bus = bus
        self.service = service
        self.decide = decide
        self.tick_s = tick_s
        self.on_recorded = on_recorded
        self.publish_timeout_s = publish_timeout_s
        self.snapshots = snapshots
        self.state = ClusterState()
        #: Bounded: a full inbox makes the log's delivery wait (`EventBus.follow`).
        self._inbox: asyncio.Queue[Incoming] = asyncio.Queue(inbox_limit)
        self._trace_headers: dict[str, dict[str, str]] = {}
        self._awaited_seq = 0
        self._catch_up_seq = 0
        self._last_pending = 0
        self._decided_at_seq = -1
        self._retry = False
        self._tracer = tracer(f"gpuloom.{service}")
        self.caught_up = asyncio.Event()
        self.dead_letters = bus.dead_letters(service)

    # --- folding -------------------------------------------------------------------

    async def _enqueue(self, message: Incoming) -> None:
        await self._inbox.put(message)

    def _fold(self, message: Incoming) -> None:
        """Fold one message; one that cannot be handled is dead-lettered, never raised."""
        try:
            recorded = decode(message.seq, message.body, message.stored_at, subject=message.subject)
        except MalformedEvent as exc:
            self._skip_malformed(message, str(exc))
            return
        except Exception as exc:  # an upcaster's bug: the same containment
            self._skip_malformed(message, f"seq {message.seq}: {type(exc).__name__}: {exc}")
            return
        faults, skewed = self.state.faults, self.state.skewed
        try:
            apply(self.state, recorded)
            if "traceparent" in message.headers:
                self._trace_headers[_aggregate_key(message.subject)] = {
                    k: v for k, v in message.headers.items() if k in ("traceparent", "tracestate")
                }
            if self.on_recorded is not None:
                self.on_recorded(recorded)
        except Exception as exc:  # a bug around the fold must cost this event, not the service
            log.exception("%s failed on seq %d", self.service, message.seq)
            reason = f"{self.service} failed on it: {type(exc).__name__}: {exc}"
            self.state.seq = max(self.state.seq, message.seq)
            self.dead_letters.from_log(message, "fault", reason, recorded.envelope.id)
            return
        if self.state.faults > faults:  # a fold rule failed on it: voided, and a bug to see
            reason = self.state.recent_voided[-1].reason
            log.error(
                "%s voided seq %d and dead-lettered it: %s", self.service, message.seq, reason
            )
            self.dead_letters.from_log(message, "fault", reason, recorded.envelope.id)
        elif self.state.skewed > skewed:  # kept, with its time bounded: a clock to fix
            reason = self.state.recent_skewed[-1].reason
            log.warning("%s bounded the time of seq %d: %s", self.service, message.seq, reason)
            self.dead_letters.from_log(message, "skew", reason, recorded.envelope.id)

    def _skip_malformed(self, message: Incoming, reason: str) -> None:
        MALFORMED.labels(self.service).inc()
        log.error("skipping malformed event: %s", reason)
        self.state.seq = max(self.state.seq, message.seq)
        self.dead_letters.from_log(message, "malformed", reason)

    def _drain(self, first: Incoming) -> None:
        message: Incoming | None = first
        count = 0
        while message is not None:
            self._fold(message)
            self._last_pending = message.pending
            count += 1
            if count >= BATCH:
                break
            try:
                message = self._inbox.get_nowait()
            except asyncio.QueueEmpty:
                message = None
        EVENTS_FOLDED.labels(self.service).inc(count)
        EVENTS_VOIDED.labels(self.service).set(self.state.voided)
        STATE_SEQ.labels(self.service).set(self.state.seq)

    def is_caught_up(self) -> bool:
        return (
            self._inbox.empty()
            and self._last_pending == 0
            and self.state.seq >= self._catch_up_seq
            and self.state.seq >= self._awaited_seq
        )

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
        parent = extract(self._trace_headers.get(key))
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
        self._awaited_seq = max(self._awaited_seq, *seqs)
        return max(seqs)

    # --- the loop ------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        figures = await self.bus.stream_figures()
        self._catch_up_seq = figures.last_seq
        if self.snapshots is not None:  # never one past the log (a stream made anew)
            restored = await self.snapshots.restore(
                at_most=figures.last_seq,
                at_least=max(0, figures.first_seq - 1),
                log_created=figures.created,
            )
            if restored is not None:
                self.state = restored
        check_no_gap(self.service, self.state.seq, figures.first_seq)
        unsubscribe = await self.bus.follow(self._enqueue, from_seq=self.state.seq + 1)
        log.info(
            "%s replaying the log from seq %d up to seq %d",
            self.service,
            self.state.seq + 1,
            self._catch_up_seq,
        )
        stopper = asyncio.create_task(stop.wait())
        # restored at the log's end, nothing will arrive: look at the state at once
        look_now = self.state.seq >= self._catch_up_seq
        try:
            while not stop.is_set():
                getter = asyncio.create_task(self._inbox.get())
                timeout = 0 if look_now else 0.5 if self._retry else self.tick_s
                look_now = False
                done, _ = await asyncio.wait(
                    {getter, stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
                )
                ticked = not done
                if getter in done:
                    self._drain(getter.result())
                else:
                    getter.cancel()
                    if stop.is_set():
                        break
                if not self.is_caught_up():
                    continue
                if not self.caught_up.is_set():
                    log.info("%s caught up at seq %d", self.service, self.state.seq)
                    self.caught_up.set()
                if self.state.seq != self._decided_at_seq or ticked:
                    await self._decide_and_publish()
                if self.snapshots is not None:  # after deciding: never delays a decision
                    self.snapshots.maybe_write(self.state)
        finally:
            stopper.cancel()
            await unsubscribe()
            if self.snapshots is not None:
                await self.snapshots.close(self.state if self.caught_up.is_set() else None)

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

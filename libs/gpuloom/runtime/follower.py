"""Following the log and folding it: the part every process that keeps a state shares.

A scheduling service's `Reactor`, the gateway's `Projector` and the accounting ledger
(fed by accounting's reactor) all start from a snapshot, follow the log from the next
sequence and fold each event with the one fold. `LogFollower` is that part, once:

- a bounded inbox that the bus's follower fills (`EventBus.follow`, which pulls only
  as the inbox takes: a slow process holds a bounded number of events);
- folding in batches of at most `BATCH` events, so a long replay still lets the
  process answer between batches;
- containment of what cannot be folded: a malformed event, one a fold rule failed on
  (a fault) and one whose time had to be bounded (skew) are dead-lettered under the
  process's name, and folding goes on;
- knowing when the state has caught up with the log as it was at start.

What a process does with each event besides folding it, it does in a `FoldObserver`:
the projector marks the rows an event touches, the ledger takes the charges the fold
applied, the reactor keeps each aggregate's trace context. An observer that raises
costs that event (dead-lettered as a fault), never the process.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

from gpuloom.bus.messages import INBOX_LIMIT, Incoming, ReasonKind, StreamFigures
from gpuloom.bus.port import Log
from gpuloom.events import MalformedEvent, Recorded, decode
from gpuloom.runtime.snapshots import Snapshotter, check_no_gap
from gpuloom.state import ClusterState, Folded, apply
from gpuloom.telemetry.metrics import EVENTS_FOLDED, EVENTS_VOIDED, MALFORMED, STATE_SEQ

log = logging.getLogger(__name__)

#: Events folded in one go before the process gets to act (decide, write rows).
BATCH = 2000


class FoldObserver(Protocol):
    """Sees each event that decodes, around its fold."""

    def before(self, recorded: Recorded) -> None:
        """The state does not hold the event yet."""

    def after(self, message: Incoming, recorded: Recorded, folded: Folded) -> None:
        """The state holds it; `folded`: what the fold made of it (voided or applied,
        and what it changed)."""


class LogFollower:
    """One process's fold of the log: its state, fed in order, nothing skipped."""

    source = "the log"

    def __init__(
        self,
        bus: Log | None,
        service: str,
        *,
        observers: Sequence[FoldObserver] = (),
        inbox_limit: int = INBOX_LIMIT,
        state: ClusterState | None = None,
        batch: int = BATCH,
    ) -> None:
        #: None: it folds only the messages handed to `fold` (an archive, a test), and
        #: dead-letters nothing.
        self.bus = bus
        #: The name it folds under: its metrics' label and its dead letters' sender.
        self.service = service
        self.observers = tuple(observers)
        #: Most events folded before the process gets to act (`BATCH`; less where the
        #: process also answers requests on the same loop: the gateway's projector).
        self.batch = batch
        self.state = state if state is not None else ClusterState()
        #: The log's last sequence when it started: caught up once folded to here.
        self.catch_up_seq = 0
        #: The log's last sequence as last seen (from each delivery's pending count).
        self.stream_seq = 0
        #: The latest sequence this process wrote itself (`wrote`): not caught up before.
        self.awaited_seq = 0
        self._last_pending = 0
        #: Bounded: a full inbox makes the log's delivery wait (`EventBus.follow`).
        self._inbox: asyncio.Queue[Incoming] = asyncio.Queue(inbox_limit)
        self._unsubscribe: Callable[[], Awaitable[None]] | None = None
        self._stopper: asyncio.Task[bool] | None = None
        self.dead_letters = bus.dead_letters(service) if bus is not None else None

    # --- start and stop ---------------------------------------------------------

    async def start(
        self,
        stop: asyncio.Event,
        snapshots: Snapshotter | None = None,
        *,
        at_most: int | None = None,
        who: str | None = None,
    ) -> StreamFigures:
        """Restore the newest usable snapshot (none past `at_most`: a projection's
        checkpoint), refuse a log whose start is gone, and follow from the next event."""
        assert self.bus is not None, "a follower without a bus folds only what it is handed"
        figures = await self.bus.stream_figures()
        self.catch_up_seq = figures.last_seq
        self.stream_seq = max(self.stream_seq, figures.last_seq)
        if snapshots is not None:  # never one past the log (a stream made anew)
            bound = figures.last_seq if at_most is None else min(at_most, figures.last_seq)
            restored = await snapshots.restore(
                at_most=bound,
                at_least=max(0, figures.first_seq - 1),
                log_created=figures.created,
            )
            if restored is not None:
                self.state = restored
        check_no_gap(who or self.service, self.state.seq, figures.first_seq)
        self._stopper = asyncio.create_task(stop.wait())
        self._unsubscribe = await self.bus.follow(self._inbox.put, from_seq=self.state.seq + 1)
        return figures

    async def close(self) -> None:
        if self._stopper is not None:
            self._stopper.cancel()
        if self._unsubscribe is not None:
            await self._unsubscribe()

    # --- folding ----------------------------------------------------------------

    async def fold_next(self, timeout: float | None) -> int:
        """Wait up to `timeout` seconds (None: until one comes) for the next event, or
        for the stop given to `start`; fold it and what the inbox holds behind it, up
        to `BATCH`. Returns how many it folded: 0 when it timed out or was stopped."""
        assert self._stopper is not None, "start() first"
        getter = asyncio.create_task(self._inbox.get())
        done, _ = await asyncio.wait(
            {getter, self._stopper}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED
        )
        if getter not in done:
            getter.cancel()
            return 0
        return self.fold_batch(getter.result())

    def fold_batch(self, first: Incoming) -> int:
        """Fold `first`, then what the inbox holds, up to `BATCH` events in all."""
        message: Incoming | None = first
        count = 0
        while message is not None:
            self.fold(message)
            count += 1
            if count >= self.batch:
                break
            try:
                message = self._inbox.get_nowait()
            except asyncio.QueueEmpty:
                message = None
        EVENTS_FOLDED.labels(self.service).inc(count)
        EVENTS_VOIDED.labels(self.service).set(self.state.voided)
        STATE_SEQ.labels(self.service).set(self.state.seq)
        return count

    def fold(self, message: Incoming) -> None:
        """Fold one message; one that cannot be handled is dead-lettered, never raised."""
        self._last_pending = message.pending
        self.stream_seq = max(self.stream_seq, message.seq + message.pending)
        try:
            recorded = decode(message.seq, message.body, message.stored_at, subject=message.subject)
        except MalformedEvent as exc:
            self._skip_malformed(message, str(exc))
            return
        except Exception as exc:  # an upcaster's bug: the same containment
            self._skip_malformed(message, f"seq {message.seq}: {type(exc).__name__}: {exc}")
            return
        state = self.state
        try:
            for observer in self.observers:
                observer.before(recorded)
            folded = apply(state, recorded)
            for observer in self.observers:
                observer.after(message, recorded, folded)
        except Exception as exc:  # a bug around the fold must cost this event, not the process
            log.exception("%s failed on seq %d", self.service, message.seq)
            reason = f"{self.service} failed on it: {type(exc).__name__}: {exc}"
            state.seq = max(state.seq, message.seq)
            self._dead_letter(message, "fault", reason, recorded.envelope.id)
            return
        if folded.voided is not None and folded.voided.fault:  # a rule failed: a bug to see
            reason = folded.voided.reason
            log.error(
                "%s voided seq %d and dead-lettered it: %s", self.service, message.seq, reason
            )
            self._dead_letter(message, "fault", reason, recorded.envelope.id)
        elif folded.skewed is not None:  # kept, with its time bounded: a clock to fix
            reason = folded.skewed.reason
            log.warning("%s bounded the time of seq %d: %s", self.service, message.seq, reason)
            self._dead_letter(message, "skew", reason, recorded.envelope.id)

    def _skip_malformed(self, message: Incoming, reason: str) -> None:
        MALFORMED.labels(self.service).inc()
        log.error("%s skipping malformed event: %s", self.service, reason)
        self.state.seq = max(self.state.seq, message.seq)
        self._dead_letter(message, "malformed", reason)

    def _dead_letter(
        self, message: Incoming, kind: ReasonKind, reason: str, envelope_id: str | None = None
    ) -> None:
        if self.dead_letters is not None:
            self.dead_letters.from_log(message, kind, reason, envelope_id)

    # --- where it stands --------------------------------------------------------

    @property
    def idle(self) -> bool:
        """Nothing waits in the inbox, and the last delivery said nothing followed it."""
        return self._inbox.empty() and self._last_pending == 0

    def is_caught_up(self) -> bool:
        """Folded all the log held at start and all this process wrote, and nothing
        more waits."""
        return self.idle and self.state.seq >= max(self.catch_up_seq, self.awaited_seq)

    def wrote(self, written: Sequence[tuple[str, int]]) -> None:
        """This process published these (subject, sequence): it is caught up only once
        it has folded them (a reactor decides again only on a state that holds its
        own decisions)."""
        self.awaited_seq = max(self.awaited_seq, *(seq for _, seq in written), 0)

    def trace_context(self, aggregate: str) -> dict[str, str] | None:
        """The fold keeps no trace contexts (a reactor's observer does)."""
        return None

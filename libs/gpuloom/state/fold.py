"""The one fold: `state = fold(events)`.

`apply` is total and deterministic. An event that is not valid at its position in
the log (placing on a GPU already taken, starting a cancelled job, a second final
event) changes nothing and is counted as voided, with its reason. Every process
uses this function, so all of them agree on what the log means.

For speed `apply` updates `state` in place, and returns what it made of the event
(`Folded`: applied, or voided with the reason, and the jobs and nodes it changed); it
never reads a clock, randomness or anything outside its arguments. Time comes from
envelopes (`at`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime, timedelta

from gpuloom.events import Event, Recorded
from gpuloom.state.errors import Invalid
from gpuloom.state.model import VOIDED_KEPT, ClusterState, Voided
from gpuloom.state.retention import expire
from gpuloom.state.rules import (
    accounts,
    cluster,
    elastic,
    health,
    jobs,
    nodes,
    policies,
    reservations,
    runs,
    webhooks,
)
from gpuloom.state.rules.common import Handler, Rule
from gpuloom.state.step import Step

#: How far an event's `at` may be from the log's own timestamp of it: writers' clocks
#: (NTP keeps them within a second) and publish retries, with a wide margin.
MAX_CLOCK_SKEW = timedelta(minutes=5)


def fold(
    events: Iterable[Recorded], state: ClusterState | None = None, *, keep_history: bool = False
) -> ClusterState:
    """Apply `events` in order to `state` (a fresh state when None) and return it."""
    current = state if state is not None else ClusterState()
    for recorded in events:
        apply(current, recorded, keep_history=keep_history)
    return current


class Folded:
    """What `apply` made of one event: applied, or voided (`voided` says why, and whether
    a rule failed: `fault`); `skewed`: its time was bounded (it was applied or voided
    with the bounded time). `jobs` and `nodes`: what the event changed, in the order
    its rule changed them (a job that left the state counts; a voided event changed
    nothing, unless a rule failed half-way), for caches kept outside the state
    (`gpuloom.state.changes.ChangeFeed`).

    Read-only by use. A plain class with slots rather than a frozen dataclass: one is
    made for every event every process folds, and a frozen dataclass's `__init__`
    costs three times as much (issue #37's end-to-end throughput)."""

    __slots__ = ("jobs", "nodes", "skewed", "voided")

    def __init__(
        self,
        voided: Voided | None = None,
        skewed: Voided | None = None,
        jobs: tuple[str, ...] = (),
        nodes: tuple[str, ...] = (),
    ) -> None:
        self.voided = voided
        self.skewed = skewed
        self.jobs = jobs
        self.nodes = nodes

    @property
    def applied(self) -> bool:
        return self.voided is None

    def __repr__(self) -> str:
        return (
            f"Folded(voided={self.voided!r}, skewed={self.skewed!r}, "
            f"jobs={self.jobs!r}, nodes={self.nodes!r})"
        )


def apply(state: ClusterState, recorded: Recorded, *, keep_history: bool = False) -> Folded:
    """Apply one recorded event. Invalid events are voided, never raised.

    `keep_history`: keep every job, even final and charged (the semantics before
    retention, `gpuloom.state.retention`): for a fold of a whole history that looks at
    jobs long ended (`gpuloom.testing.cluster.check_log`), and tests that compare the
    two. Every service forgets; the state's value does not say which a fold did."""
    state.seq = recorded.seq
    skewed: Voided | None = None
    step: Step | None = None
    handler = _HANDLERS.get(type(recorded.event))
    try:
        if handler is None:
            raise Invalid(f"no fold rule for {recorded.envelope.type}")
        at = recorded.envelope.at
        if at.tzinfo is None or at.utcoffset() is None:
            raise Invalid("the envelope's time has no time zone")
        stored = recorded.stored_at
        if stored is not None and abs(at - stored) > MAX_CLOCK_SKEW:
            recorded, skewed = _clamped(state, recorded, stored)
            at = recorded.envelope.at
        step = Step(recorded, keep_history=keep_history)
        handler(state, recorded.event, step)
    except Invalid as why:
        return Folded(_void(state, recorded, str(why), fault=False), skewed, *_changed(step))
    except Exception as exc:  # containment: one bad event must never stop a fold
        # A rule failed where its checks did not expect it. Rules mostly check before
        # they change anything, so the event is voided like an invalid one (a rule that
        # failed half-way leaves what it changed, the same in every service); the fault
        # is counted apart so that services dead-letter the event and an operator sees it.
        failed = f"fold rule failed: {type(exc).__name__}: {exc}"
        return Folded(_void(state, recorded, failed, fault=True), skewed, *_changed(step))
    state.applied += 1
    if state.clock is None or at > state.clock:
        state.clock = at  # the log's time: the latest applied event
        expire(state)  # tombstones past their window (retention.py)
    return Folded(None, skewed, tuple(step.jobs), tuple(step.nodes))


def _changed(step: Step | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """What a voided event's rule changed before it failed (nothing, as a rule checks
    before it changes anything, but for a fault half-way)."""
    return ((), ()) if step is None else (tuple(step.jobs), tuple(step.nodes))


def _clamped(state: ClusterState, recorded: Recorded, stored: datetime) -> tuple[Recorded, Voided]:
    """The event with its time moved to within MAX_CLOCK_SKEW of when the log stored it.

    A fact is kept (a JobFinished from a host whose clock drifted is still true), but
    a writer's clock, or a forged time, cannot move the log's clock (ageing, decay,
    reservations, charges) by more than the bound. Counted, and kept for inspection.
    """
    at = recorded.envelope.at
    bounded = min(max(at, stored - MAX_CLOCK_SKEW), stored + MAX_CLOCK_SKEW)
    state.skewed += 1
    skew = Voided(
        recorded.seq,
        recorded.envelope.type,
        f"time {at.isoformat()} is {abs(at - stored).total_seconds():.0f} s from when the "
        f"log stored it; taken as {bounded.isoformat()}",
    )
    state.recent_skewed.append(skew)
    del state.recent_skewed[:-VOIDED_KEPT]
    envelope = recorded.envelope.model_copy(update={"at": bounded})
    return dataclasses.replace(recorded, envelope=envelope), skew


def _void(state: ClusterState, recorded: Recorded, reason: str, *, fault: bool) -> Voided:
    state.voided += 1
    state.faults += fault
    voided = Voided(recorded.seq, recorded.envelope.type, reason, fault)
    state.recent_voided.append(voided)
    del state.recent_voided[:-VOIDED_KEPT]
    return voided


def rule_table(*modules: tuple[Rule, ...]) -> dict[type[Event], Handler]:
    """One table of every module's rules; an event type with two rules is a bug."""
    table: dict[type[Event], Handler] = {}
    for kind, handler in (entry for rules in modules for entry in rules):
        if kind in table:
            raise ValueError(f"two fold rules for {kind.__name__}")
        table[kind] = handler
    return table


#: Every rule of the fold, by the exact type of the event it applies: one module per
#: aggregate (`gpuloom.state.rules`).
_HANDLERS: dict[type[Event], Handler] = rule_table(
    jobs.RULES,
    runs.RULES,
    elastic.RULES,
    nodes.RULES,
    accounts.RULES,
    cluster.RULES,
    policies.RULES,
    reservations.RULES,
    webhooks.RULES,
    health.RULES,
)

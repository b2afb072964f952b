"""One scheduling pass over the queue: place, preempt, reserve, backfill (EASY).

`schedule` is the pure core of a placement cycle, shared by the live placement
service (through `gpuloom.placement.cycle`) and by `bench/queue_replay.py`.
It takes the pending jobs in queue order and walks them once:

* A job that fits is placed.
* The first job that does not fit (the *blocked* job) may preempt: jobs of a
  lower priority class that are `preemptible`, or, when its account is within
  its nominal quota, jobs of accounts that borrow beyond theirs. The victim set
  is the smallest that lets it fit (`gpuloom.placement.preemption`).
* The first blocked job for which a start can be foreseen gets the one
  reservation (EASY backfill): the earliest time at which it fits, found by
  letting running jobs end in the order of their time limits, and the
  resources it would take then.
* With `backfill="easy"`, every later job may still start now if it fits and
  either ends (by its time limit) before the reservation starts, or leaves the
  reserved resources alone. "Alone" is exact: a job that may run past the
  reservation sees each reserved GPU and host with at most what will be left
  over once the reserved job has taken its share at that time, so no job is
  backfilled into a slot that delays the reserved one. With `backfill="off"`
  the walk stops at the blocked job: strict priority (or FIFO) order.

Time (`now`, every `ends_at`) is the log's, in integer milliseconds since the
epoch (exact both ways with the events' datetimes); nothing here reads a clock, and every order is total, so the same inputs give the same outcomes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from gpuloom.events.accounts import GPU_MILLI
from gpuloom.placement.candidate import Candidate
from gpuloom.placement.engine import Context, NodeIndex, Policy
from gpuloom.placement.holdings import HeldSum, Holding, scratch
from gpuloom.placement.preemption import choose_victims
from gpuloom.placement.quota_fit import Where, where_demand, where_limited, within_quota
from gpuloom.placement.reservation import (
    Protection,
    Reservation,
    find_reservation,
    must_leave_slack,
    try_place,
)
from gpuloom.placement.resources import Placement, Request
from gpuloom.queueing.quota import QuotaBook

Backfill = Literal["easy", "off"]

#: Start order of jobs placed in this pass: after every running job, never a victim.
NEW_ORDER = 1 << 62
PreemptReason = Literal["priority", "reclaim"]

__all__ = [
    "Backfill",
    "Outcome",
    "Placed",
    "Preempted",
    "Reservation",
    "Reserved",
    "SchedulingPass",
    "find_reservation",
    "schedule",
]


@dataclass(frozen=True, slots=True)
class Placed:
    candidate: Candidate
    placement: Placement
    #: Started while a job ahead of it in the queue could not start.
    backfilled: bool
    position: int


@dataclass(frozen=True, slots=True)
class Reserved:
    reservation: Reservation
    position: int


@dataclass(frozen=True, slots=True)
class Preempted:
    """`candidate` stops `victims` (positions `position`, `position + 1`, ...)."""

    candidate: Candidate
    victims: tuple[Holding, ...]
    reason: PreemptReason
    position: int


Outcome = Placed | Reserved | Preempted


def _victims_for(
    candidate: Candidate,
    index: NodeIndex,
    holdings: Sequence[Holding],
    quotas: QuotaBook | None,
    policy: Policy,
    context: Context,
) -> tuple[tuple[Holding, ...], PreemptReason] | None:
    """Preempt by priority class first; else reclaim the account's nominal quota."""
    holdings = [h for h in holdings if h.order < NEW_ORDER]
    by_class = [
        h for h in holdings if h.preemptible and h.priority_class < candidate.priority_class
    ]
    if not by_class and quotas is None:
        return None
    copies: list[NodeIndex] = []

    def choose(among: list[Holding]) -> tuple[Holding, ...] | None:
        """Victims among `among`, tried on a copy of the views (see `holdings`), made
        once and only when there is someone to try: at 5,000 nodes a copy costs tens
        of milliseconds, in every cycle with a blocked job."""
        if not among:
            return None
        if not copies:
            copies.append(scratch(index))
        return choose_victims(candidate.request, copies[0], among, policy, context)

    victims = choose(by_class)
    if victims is not None:
        return victims, "priority"
    tracker = quotas.trackers.get(GPU_MILLI) if quotas is not None else None
    if tracker is None:
        return None
    quota = tracker.quotas.get(candidate.account)
    if quota is None or quota.nominal is None:
        return None
    if tracker.used.get(candidate.account, 0) + candidate.demand_milli > quota.nominal:
        return None
    borrowing = tracker.borrowing
    victims = choose(
        [h for h in holdings if h.account != candidate.account and borrowing(h.account)]
    )
    return (victims, "reclaim") if victims is not None else None


class SchedulingPass:
    """One walk over the queue (see the module doc). Its fields are what the walk has
    learned so far; each step is a method named for what it decides. It mutates the
    index and the quota book with what it places."""

    def __init__(
        self,
        index: NodeIndex,
        holdings: Sequence[Holding] | Callable[[], Sequence[Holding]],
        *,
        now: int,
        policy: Policy,
        context: Context,
        backfill: Backfill = "easy",
        preemption: bool = True,
        quotas: QuotaBook | None = None,
        current: Reservation | None = None,
        limit: int = 10_000,
        depth: int | None = None,
        by_end: Callable[[], tuple[list[Holding], HeldSum]] | None = None,
        released: Callable[[list[Holding]], NodeIndex | None] | None = None,
    ) -> None:
        self.index = index
        self.now = now
        self.policy = policy
        self.context = context
        self.backfill = backfill
        self.preemption = preemption
        self.quotas = quotas
        self.current = current
        self.limit = limit
        self.depth = depth
        self.outcomes: list[Outcome] = []
        #: What runs, looked at only once a job is blocked: built then if given lazily.
        self._holdings = holdings
        self._running: list[Holding] | None = None if callable(holdings) else list(holdings)
        self._placed_now: list[Holding] = []
        #: The same running holdings, split by whether they end (`KeptHoldings.by_end`):
        #: while no victim changed them, the reservation search takes them so.
        self._by_end = by_end
        #: The views with every running job and `_placed_now` given back (`released`).
        self._released = released
        self.position = 0
        self.placed = 0
        self.tried_behind = 0
        #: A job could not start: the jobs after it are backfilled (or, off, not tried).
        self.blocked = False
        self.preempt_tried = False
        self.reservation: Reservation | None = None
        self.protection: Protection | None = None
        self._where: Where | None = None
        #: A pass only ever takes resources (and the reservation's slack only shrinks),
        #: so a request that found no room finds none later in the pass either:
        #: feasibility does not depend on scores, so skipping it changes no decision.
        self._failed: set[tuple[Request, bool]] = set()

    def run(self, candidates: Iterable[Candidate]) -> list[Outcome]:
        for candidate in candidates:
            if not self._goes_on():
                break
            turn = self.position  # each step of this candidate decides at this position
            admitted = self._within_quotas(candidate)
            if admitted is None:
                continue  # held by a quota, a GPU maximum, or every model or pool it may use
            if self._place(admitted, turn) or self.reservation is not None:
                continue  # placed; or it waits (EASY: one reservation)
            self.blocked = True
            decision = self._decision(turn)
            self._preempt_for(admitted, decision)
            self._reserve_for(admitted, decision)
            if self.backfill == "off":
                break
        return self.outcomes

    # --- the steps, in the order a candidate meets them ---------------------------------

    def _goes_on(self) -> bool:
        """Under the pass's limit of placements, and of jobs tried behind the blocked one
        (`depth`, as Slurm's `bf_max_job_test`)."""
        if self.placed >= self.limit:
            return False
        if self.blocked:
            self.tried_behind += 1
            if self.depth is not None and self.tried_behind > self.depth:
                return False
        return True

    def _within_quotas(self, candidate: Candidate) -> Candidate | None:
        """The candidate, narrowed to the models and pools its quotas admit; None: held
        (QuotaExceeded, AssocGrpGRES for `max_gpus`, or no model or pool admitted)."""
        quotas = self.quotas
        if quotas is None:
            return candidate
        if quotas.why_not(candidate.account, candidate.demand, candidate.user or None):
            return None
        if self._where is None:
            self._where = where_limited(self.index, quotas)
        return within_quota(candidate, quotas, self._where) if self._where else candidate

    def _decision(self, position: int) -> Context:
        """What a decision at `position` of this pass may depend on: made only for the
        candidates that get that far (most of a long queue is skipped before)."""
        return Context(self.context.seed, position, self.context.workload)

    def _place(self, candidate: Candidate, turn: int) -> bool:
        """Place it now if it fits (within the reservation's slack if it may outlast
        its start); charge its quotas; True when placed."""
        masked = must_leave_slack(candidate, self.reservation, self.protection, self.now)
        if (candidate.request, masked) in self._failed:
            return False  # the same request found no room earlier in this pass
        protection = self.protection if masked else None
        placement = try_place(candidate, self.index, self.policy, self._decision(turn), protection)
        if placement is None:
            self._failed.add((candidate.request, masked))
            return False
        if self.quotas is not None:
            self.quotas.take(
                candidate.account,
                {**candidate.demand, **where_demand(self.index, placement)},
                candidate.user or None,
            )
        self.outcomes.append(Placed(candidate, placement, self.blocked, self.position))
        self.position += 1
        self.placed += 1
        order = len(self._placed_now)
        self._placed_now.append(_holding_of(candidate, placement, self.now, order))
        return True

    def _preempt_for(self, candidate: Candidate, decision: Context) -> None:
        """The first blocked job alone may preempt; one whose class may not (its
        `may_preempt` false) uses that turn up, so no job behind it jumps it."""
        if not self.preemption or self.preempt_tried or candidate.awaiting_victims:
            return
        self.preempt_tried = True
        if not candidate.may_preempt:
            return
        chosen = _victims_for(
            candidate, self.index, self._held(), self.quotas, self.policy, decision
        )
        if chosen is None:
            return
        victims, reason = chosen
        self.outcomes.append(Preempted(candidate, victims, reason, self.position))
        self.position += len(victims)
        stopping = {v.job_id for v in victims}
        self._by_end = None  # the victims now end: `_running` alone says what runs
        self._running = [
            replace(h, stopping=True, ends_at=self.now) if h.job_id in stopping else h
            for h in self._held()
            if h.order < NEW_ORDER
        ]

    def _reserve_for(self, candidate: Candidate, decision: Context) -> None:
        """Give the blocked job the reservation, at the earliest start it can foresee."""
        if self._by_end is None:
            found = find_reservation(candidate, self.index, self._held(), self.policy, decision)
        else:
            timed, unbounded = self._by_end()
            released = self._released(self._placed_now) if self._released is not None else None
            found = find_reservation(
                candidate, self.index, [*timed, *self._placed_now], self.policy, decision,
                unbounded, released,
            )  # fmt: skip
        if found is None:
            return
        self.reservation, self.protection = found
        if self.reservation != self.current:
            self.outcomes.append(Reserved(self.reservation, self.position))
            self.position += 1

    def _held(self) -> list[Holding]:
        """What runs, with what this pass placed (never a victim, `NEW_ORDER`)."""
        if self._running is None:
            assert callable(self._holdings)
            self._running = list(self._holdings())
        return [*self._running, *self._placed_now]


def schedule(
    candidates: Iterable[Candidate],
    index: NodeIndex,
    holdings: Sequence[Holding] | Callable[[], Sequence[Holding]],
    *,
    now: int,
    policy: Policy,
    context: Context,
    backfill: Backfill = "easy",
    preemption: bool = True,
    quotas: QuotaBook | None = None,
    current: Reservation | None = None,
    limit: int = 10_000,
    depth: int | None = None,
    by_end: Callable[[], tuple[list[Holding], HeldSum]] | None = None,
    released: Callable[[list[Holding]], NodeIndex | None] | None = None,
) -> list[Outcome]:
    """Walk `candidates` (queue order) once; see the module doc. Mutates `index` and `quotas`
    with what is placed; `current` is the reservation already recorded (not repeated).
    `holdings` (what runs) may be a function: it is called only if a job is blocked.

    `depth` bounds how many jobs behind the first blocked one are tried (as Slurm's
    `bf_max_job_test`): a pass over a long queue then costs a bounded time.
    `by_end`, when given, returns the same holdings as `holdings`, split: those with an
    end, and the sum of those without (`KeptHoldings.by_end`); the reservation search
    then gives the latter back at the cost of the nodes, not of the jobs. With it,
    `released(placed)` may give the views with every running job and `placed` given
    back (`IndexCache.released`), kept from cycle to cycle for the search's last step.
    """
    return SchedulingPass(
        index, holdings, now=now, policy=policy, context=context, backfill=backfill,
        preemption=preemption, quotas=quotas, current=current, limit=limit, depth=depth,
        by_end=by_end, released=released,
    ).run(candidates)  # fmt: skip


def _holding_of(candidate: Candidate, placement: Placement, now: int, order: int) -> Holding:
    return Holding(
        job_id=candidate.job_id,
        replicas=placement.replicas,
        ends_at=now + 1000 * candidate.time_limit_s if candidate.time_limit_s is not None else None,
        priority_class=candidate.priority_class,
        preemptible=candidate.preemptible,
        account=candidate.account,
        order=NEW_ORDER + order,
    )

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
from datetime import UTC, datetime
from typing import Literal

from gpuloom.placement.candidate import Candidate
from gpuloom.placement.elastic import Growth, after_shrink, per_replica, scaled
from gpuloom.placement.elastic_steps import ElasticSteps
from gpuloom.placement.engine import Context, NodeIndex, Policy, release
from gpuloom.placement.fences import Fence, Fences
from gpuloom.placement.holdings import HeldSum, Holding
from gpuloom.placement.outcomes import (
    Outcome,
    Placed,
    Preempted,
    Reserved,
    WaitCode,
    Waiting,
    wait_code,
)
from gpuloom.placement.preemption import victims_for
from gpuloom.placement.quota_fit import Where, where_demand, where_limited, within_quota
from gpuloom.placement.reservation import (
    Protection,
    Reservation,
    find_reservation,
    must_leave_slack,
    try_place,
)
from gpuloom.placement.resources import Placement, Request
from gpuloom.placement.topology import place, topology_shortfall
from gpuloom.queueing.quota import QuotaBook

Backfill = Literal["easy", "off"]

#: Start order of jobs placed in this pass: after every running job, never a victim.
NEW_ORDER = 1 << 62

__all__ = [
    "Backfill",
    "PassInputs",
    "Rules",
    "SchedulingPass",
    "find_reservation",
    "schedule",
]


@dataclass(frozen=True, slots=True)
class Rules:
    """What the queue's policy (`QueuePolicySet`) lets a pass do."""

    backfill: Backfill = "easy"
    preemption: bool = True
    #: The most placements in one pass.
    limit: int = 10_000
    #: The most jobs tried behind the first that cannot start (Slurm's `bf_max_job_test`).
    depth: int | None = None


@dataclass
class PassInputs:
    """All a pass reads: the pending jobs in queue order, the nodes, what runs, the quotas
    and the log's time. `gpuloom.placement.inputs.pass_inputs` makes them from the folded
    state as they are (the reference); `IndexCache.pass_inputs` makes the same from what
    it kept of the last cycle (the fast twin).

    `holdings` (what runs) may be a function: it is called only if a job is blocked.
    `by_end`, when given, returns the same holdings split: those with an end, and the sum
    of those without (`KeptHoldings.by_end`); the reservation search then gives the
    latter back at the cost of the nodes, not of the jobs. With it, `released(placed)`
    may give the views with every running job and `placed` given back
    (`IndexCache.released`), kept from cycle to cycle for the search's last step.
    """

    candidates: Iterable[Candidate]
    index: NodeIndex
    context: Context
    #: The log's time, in integer milliseconds since the epoch.
    now: int
    holdings: Sequence[Holding] | Callable[[], Sequence[Holding]]
    quotas: QuotaBook | None = None
    #: The reservation already recorded (not written again).
    current: Reservation | None = None
    by_end: Callable[[], tuple[list[Holding], HeldSum]] | None = None
    released: Callable[[list[Holding]], NodeIndex | None] | None = None
    #: The advance reservations (`gpuloom.placement.fences`), by name.
    fences: Sequence[Fence] = ()
    #: The running elastic gangs that may grow (`inputs.growable_of`), asked for only at
    #: the end of a pass that blocked no job.
    growable: Callable[[], Sequence[Growth]] | None = None


class SchedulingPass(ElasticSteps):
    """One walk over the queue (see the module doc). Its fields are what the walk has
    learned so far; each step is a method named for what it decides. It mutates the
    index and the quota book with what it places.

    Every job it meets and does not place gets a `Waiting` with the reason; where it
    stops before the end of the queue (backfill off, its depth or its limit reached),
    `stopped` says why, which is the reason (`Priority`) of every job after that point.
    `until`: stop once each of these jobs has been decided (what explain asks about a
    few jobs).
    """

    def __init__(
        self,
        inputs: PassInputs,
        policy: Policy,
        rules: Rules = Rules(),
        *,
        until: frozenset[str] | None = None,
        reasons: bool = True,
    ) -> None:
        self.index = inputs.index
        #: Say why each job waits in full (explain, the pending reasons). The placement
        #: service writes decisions only: without, a job that fits nowhere waits with
        #: `Resources` and no detail, and what finding the reason costs (the room each
        #: domain has, the reservations in the way) is not spent.
        self.reasons = reasons
        self.now = inputs.now
        self.policy = policy
        self.context = inputs.context
        self.rules = rules
        self._limit = rules.limit
        self.quotas = inputs.quotas
        self.current = inputs.current
        #: The jobs still to decide before the pass may stop (None: it goes to the end).
        self._until = set(until) if until is not None else None
        self.outcomes: list[Outcome] = []
        #: What runs, looked at only once a job is blocked: built then if given lazily.
        self._holdings = inputs.holdings
        self._running: list[Holding] | None = (
            None if callable(inputs.holdings) else list(inputs.holdings)
        )
        self._placed_now: list[Holding] = []
        #: The same running holdings, split by whether they end (`KeptHoldings.by_end`):
        #: while no victim changed them, the reservation search takes them so.
        self._by_end = inputs.by_end
        #: The views with every running job and `_placed_now` given back (`released`).
        self._released = inputs.released
        self.position = 0
        #: Why the pass went no further than it did (None: it met every job).
        self.stopped: str | None = None
        self.placed = 0
        self.tried_behind = 0
        #: Jobs passed over because their user has as many placed and not started as
        #: the limit allows (`QuotaBook.pacing_why_not`): bounded as `tried_behind`, so
        #: that one user's backlog of thousands costs each pass a bounded walk.
        self.paced = 0
        #: A job could not start: the jobs after it are backfilled (or, off, not tried).
        self.blocked = False
        self.preempt_tried = False
        self.reservation: Reservation | None = None
        self.protection: Protection | None = None
        self._where: Where | None = None
        #: A pass only ever takes resources (and the reservation's slack only shrinks),
        #: so a request that found no room finds none later in the pass either:
        #: feasibility does not depend on scores, so skipping it changes no decision.
        #: The value is why it waits (`Resources`, or `Reservation` where it would fit
        #: but for the reservation's slack).
        self._failed: dict[tuple[Request, bool, tuple[str, ...]], Waiting] = {}
        #: The advance reservations' GPUs, hidden but from the jobs that may use them.
        self.fences = Fences(inputs.fences, self.index) if inputs.fences else None
        self._growable = inputs.growable

    def run(self, candidates: Iterable[Candidate]) -> list[Outcome]:
        try:
            for candidate in candidates:
                self.stopped = self._stops()
                if self.stopped is not None:
                    break
                self._decide(candidate)
                if self._decided(candidate.job_id):
                    break
            else:
                self._grow()
        finally:
            if self.fences is not None:
                self.fences.lift()
        return self.outcomes

    def _decide(self, candidate: Candidate) -> None:
        turn = self.position  # each step of this candidate decides at this position
        admitted = self._within_quotas(candidate)
        if admitted is None:
            return  # held by a quota, a GPU maximum, or every model or pool it may use
        if admitted.reservation is not None:  # only its reservation's GPUs: never blocks
            waiting = self._place_inside(admitted, admitted.reservation, turn)
            if waiting is not None:
                self.outcomes.append(waiting)
            return
        waiting = self._place(admitted, turn)
        if waiting is None:
            return  # placed
        if self.reservation is not None:  # it waits (EASY: one reservation)
            self.outcomes.append(waiting)
            return
        self.blocked = True
        decision = self._decision(turn)
        self._preempt_for(admitted, decision)
        self.outcomes.append(self._reserve_for(admitted, decision, waiting))

    # --- the steps, in the order a candidate meets them ---------------------------------

    def _stops(self) -> str | None:
        """Why the pass goes no further (None: it goes on): the pass's limit of placements,
        strict order behind a blocked job, or the jobs tried behind it (`depth`, as
        Slurm's `bf_max_job_test`)."""
        rules = self.rules
        if self.placed >= rules.limit:
            return f"a placement pass places at most {rules.limit} jobs"
        if rules.depth is not None and self.paced >= rules.depth:
            return (
                f"a placement pass passes over at most {rules.depth} jobs held back by"
                " their users' jobs not started yet (backfill depth)"
            )
        if not self.blocked:
            return None
        if rules.backfill == "off":
            return "a job ahead cannot start, and nothing passes it (backfill off)"
        self.tried_behind += 1
        if rules.depth is not None and self.tried_behind > rules.depth:
            return (
                f"a placement pass tries at most {rules.depth} jobs behind the first that"
                " cannot start (backfill depth)"
            )
        return None

    def _decided(self, job_id: str) -> bool:
        """Note `job_id` decided; whether every job of `until` now is."""
        if self._until is None:
            return False
        self._until.discard(job_id)
        return not self._until

    def _within_quotas(self, candidate: Candidate) -> Candidate | None:
        """The candidate, narrowed to the models and pools its quotas admit; None: held
        (QuotaExceeded, AssocGrpGRES for `max_gpus`, or no model or pool admitted)."""
        quotas = self.quotas
        if quotas is None:
            return candidate
        refusal = quotas.why_not(candidate.account, candidate.demand, candidate.user or None)
        if refusal is None:
            if self._where is None:
                self._where = where_limited(self.index, quotas)
            if not self._where:
                return candidate
            narrowed = within_quota(candidate, quotas, self._where)
            if not isinstance(narrowed, str):
                return narrowed
            refusal = narrowed
        code = wait_code(refusal)
        self.paced += code == "StartPacing"
        self.outcomes.append(Waiting(candidate.job_id, code, refusal))
        return None

    def _place(self, candidate: Candidate, turn: int) -> Waiting | None:
        """Place it now if it fits (within the reservation's slack if it may outlast
        its start, through the fences it may pass); charge its quotas. None when placed,
        else why it waits."""
        masked = must_leave_slack(candidate, self.reservation, self.protection, self.now)
        fences = self.fences
        opened = fences.open_keys(self.now, candidate.time_limit_s) if fences else ()
        failed = self._failed.get((candidate.request, masked, opened))
        if failed is not None:  # the same request found no room earlier in this pass
            return Waiting(candidate.job_id, failed.code, failed.detail)
        protection = self.protection if masked else None
        decision = self._decision(turn)
        if fences is not None and opened:
            with fences.seen_through(opened):
                placement = try_place(candidate, self.index, self.policy, decision, protection)
                placement = self._with_extra(candidate, placement, decision)
        else:
            placement = try_place(candidate, self.index, self.policy, decision, protection)
            placement = self._with_extra(candidate, placement, decision)
        if placement is None:
            waiting = self._why_not_placed(candidate, masked, turn)
            self._failed[(candidate.request, masked, opened)] = waiting
            return waiting
        self._took(candidate, placement)
        return None

    def _place_inside(self, candidate: Candidate, name: str, turn: int) -> Waiting | None:
        """A job of advance reservation `name`: on its GPUs, once it started, if it lets
        the job in. None when placed, else why it waits."""
        fence = self.fences.fences.get(name) if self.fences is not None else None
        job_id = candidate.job_id
        if fence is None:
            return Waiting(job_id, "Reservation", f"reservation {name} is gone")
        if not fence.lets_in(candidate.user, candidate.account):
            return Waiting(job_id, "Reservation", f"reservation {name} does not let it in")
        if not fence.started:
            return Waiting(
                job_id,
                "Reservation",
                f"waiting for reservation {name} to start at {_iso(fence.start)}",
            )
        assert self.fences is not None
        placement = self.fences.place_inside(
            name, candidate.request, self.policy, self._decision(turn)
        )
        if placement is None:
            code, detail = self._no_room(candidate)
            return Waiting(job_id, code, f"{detail} in reservation {name}")
        self._took(candidate, placement)
        return None

    def _took(self, candidate: Candidate, placement: Placement) -> None:
        """`candidate` is placed: charge its quotas, say so, and count what it holds."""
        if self.quotas is not None:
            demand = candidate.demand
            if len(placement.replicas) != candidate.request.replicas:  # an elastic gang's extra
                unit = per_replica(demand, candidate.request.replicas)
                demand = scaled(unit, len(placement.replicas))
            self.quotas.take(
                candidate.account,
                {**demand, **where_demand(self.index, placement)},
                candidate.user or None,
            )
        self.outcomes.append(Placed(candidate, placement, self.blocked, self.position))
        self.position += 1
        self.placed += 1
        order = len(self._placed_now)
        self._placed_now.append(_holding_of(candidate, placement, self.now, order))

    def _why_not_placed(self, candidate: Candidate, masked: bool, turn: int) -> Waiting:
        """`Reservation` when a node could host it now but for the reserved job's slack
        (it may run past that job's start); `Resources` otherwise."""
        job_id = candidate.job_id
        if not self.reasons:
            return Waiting(job_id, "Resources", "")
        if masked and self.reservation is not None and self._fits_unmasked(candidate.request, turn):
            return Waiting(
                job_id,
                "Reservation",
                f"it would delay {self.reservation.job_id}, which holds the reservation;"
                " a time limit that ends before its start lets it backfill",
            )
        if self.fences is not None:
            blocking = self.fences.blocking(candidate.request, self.policy, self._decision(turn))
            if blocking:
                return Waiting(job_id, *_fenced(blocking))
        return Waiting(job_id, *self._no_room(candidate))

    def _fits_unmasked(self, request: Request, turn: int) -> bool:
        """Whether the request fits now without the reservation's slack: one replica on
        one node asks the index's best host; a gang (or a topology request) is placed and
        given back, since one replica fitting says nothing of the others."""
        decision = self._decision(turn)
        if request.replicas == 1 and request.topology is None:
            return self.index.best_local(request, self.policy, decision) is not None
        placement = place(request, self.index, self.policy, decision)
        if placement is None:
            return False
        for replica in reversed(placement.replicas):
            release(self.index, replica)
        return True

    def _no_room(self, candidate: Candidate) -> tuple[WaitCode, str]:
        """Why a job that fits nowhere now waits: `Topology`, naming what each domain has,
        when it must be inside one domain; `Resources` otherwise."""
        ask = candidate.request.topology
        if ask is not None and ask[1] == "required":
            return "Topology", topology_shortfall(candidate.request, self.index, ask[0])
        return "Resources", "no node has room for it now"

    def _preempt_for(self, candidate: Candidate, decision: Context) -> None:
        """The first blocked job alone may preempt; one whose class may not (its
        `may_preempt` false) uses that turn up, so no job behind it jumps it."""
        if not self.rules.preemption or self.preempt_tried or candidate.awaiting_victims:
            return
        self.preempt_tried = True
        if not candidate.may_preempt:
            return
        running = [h for h in self._held() if h.order < NEW_ORDER]
        if self.fences is not None:  # stopping a job on a fenced GPU frees nothing usable
            hidden = self.fences.hidden
            running = [h for h in running if not _on_any(h, hidden)]
        chosen = victims_for(candidate, self.index, running, self.quotas, self.policy, decision)
        if chosen is None:
            return
        victims, reason = chosen
        self.outcomes.append(Preempted(candidate, victims, reason, self.position))
        self.position += len(victims)
        stopping = {v.job_id for v in victims if not v.shrink}
        shrinking = {v.job_id: v for v in victims if v.shrink}
        self._by_end = None  # the victims now end: `_running` alone says what runs
        after: list[Holding] = []
        for held in self._held():
            if held.order >= NEW_ORDER:
                continue
            if held.job_id in stopping:
                after.append(replace(held, stopping=True, ends_at=self.now))
            elif held.job_id in shrinking:
                after.extend(after_shrink(held, shrinking[held.job_id], self.now))
            else:
                after.append(held)
        self._running = after

    def _reserve_for(self, candidate: Candidate, decision: Context, waiting: Waiting) -> Waiting:
        """Give the blocked job the reservation, at the earliest start it can foresee;
        why it waits (`waiting`: why it could not be placed, with what follows)."""
        fences = self.fences
        if self._by_end is None:
            found = find_reservation(
                candidate, self.index, self._held(), self.policy, decision, fences=fences
            )
        else:
            timed, unbounded = self._by_end()
            released = self._released(self._placed_now) if self._released is not None else None
            found = find_reservation(
                candidate, self.index, [*timed, *self._placed_now], self.policy, decision,
                unbounded, released, fences=fences,
            )  # fmt: skip
        code, detail = waiting.code, waiting.detail
        stopping = self.outcomes[-1] if self.outcomes else None
        if isinstance(stopping, Preempted) and stopping.candidate.job_id == candidate.job_id:
            detail += f"; {len(stopping.victims)} job(s) are being stopped for it"
        elif candidate.awaiting_victims:
            detail += "; the jobs stopped for it have not ended yet"
        if found is None:
            return Waiting(candidate.job_id, code, detail)
        self.reservation, self.protection = found
        if self.reservation != self.current:
            self.outcomes.append(Reserved(self.reservation, self.position))
            self.position += 1
        return Waiting(candidate.job_id, code, f"{detail}; it holds the reservation")

    def _held(self) -> list[Holding]:
        """What runs, with what this pass placed (never a victim, `NEW_ORDER`)."""
        if self._running is None:
            assert callable(self._holdings)
            self._running = list(self._holdings())
        return [*self._running, *self._placed_now]


def schedule(
    inputs: PassInputs,
    policy: Policy,
    rules: Rules = Rules(),
    *,
    until: frozenset[str] | None = None,
    reasons: bool = True,
) -> list[Outcome]:
    """Walk `inputs.candidates` (queue order) once; see the module doc and
    `SchedulingPass`. Mutates `inputs.index` and `inputs.quotas` with what is placed."""
    walk = SchedulingPass(inputs, policy, rules, until=until, reasons=reasons)
    return walk.run(inputs.candidates)


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


def _on_any(holding: Holding, gpus: frozenset[tuple[str, int]]) -> bool:
    return any((p.node, p.index) in gpus for r in holding.replicas for p in r.slices)


def _fenced(blocking: Sequence[Fence]) -> tuple[WaitCode, str]:
    """Why a job that would fit but for advance reservations waits: `ReqNodeNotAvail`
    where a maintenance window holds the room, `Reservation` otherwise."""
    maint = [f for f in blocking if f.maint]
    shown = maint or list(blocking)
    named = "; ".join(
        f"{f.name} ({'maintenance, ' if f.maint else ''}{_iso(f.start)} to {_iso(f.end)})"
        for f in shown
    )
    if maint:
        return (
            "ReqNodeNotAvail",
            f"the room it would take is held by a maintenance reservation: {named}",
        )
    return (
        "Reservation",
        f"the room it would take is held by reservation(s) {named}; a time limit that ends"
        " before a reservation's start lets it run there until then",
    )


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")

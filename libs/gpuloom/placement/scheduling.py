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

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Literal

from gpuloom.events.accounts import GPU_MILLI
from gpuloom.placement.engine import Context, NodeIndex, Policy, place
from gpuloom.placement.holdings import Holding, release_all, scratch
from gpuloom.placement.preemption import choose_victims
from gpuloom.placement.resources import Placement, ReplicaPlacement, Request, fits_locally
from gpuloom.queueing.quota import QuotaBook

Backfill = Literal["easy", "off"]

#: Start order of jobs placed in this pass: after every running job, never a victim.
NEW_ORDER = 1 << 62
PreemptReason = Literal["priority", "reclaim"]


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pending job as the scheduler sees it."""

    job_id: str
    request: Request
    time_limit_s: int | None = None
    priority_class: int = 0
    account: str = ""
    #: What the job takes of the quota resources known before placement
    #: (`gpu_milli`, `gpus`); its model and pool ones follow from where it lands.
    demand: Mapping[str, int] = field(default_factory=dict)
    preemptible: bool = False
    #: Jobs were already stopped for it and have not ended yet: it preempts no more.
    awaiting_victims: bool = False
    #: Its user, for the per-identity GPU maxima ("": none checked).
    user: str = ""
    #: Its priority class lets it preempt (`PriorityClassSet.may_preempt`); a job
    #: whose class may not never stops another, for priority or to reclaim quota.
    may_preempt: bool = True

    @property
    def demand_milli(self) -> int:
        return self.demand.get(GPU_MILLI, 0)


@dataclass(frozen=True, slots=True)
class Reservation:
    """`job_id` is to start at `start_at` (None: once jobs without time limits end) there."""

    job_id: str
    start_at: int | None
    replicas: tuple[ReplicaPlacement, ...]


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


@dataclass
class _Protection:
    """What a job that may outlast the reservation may take of each reserved resource.

    The slack of a GPU or host is what it will have free at the reservation's
    start once the reserved job has taken its part; long jobs placed meanwhile
    use it up.
    """

    gpu_slack: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    host_slack: dict[str, list[int | None]] = field(default_factory=dict)

    def apply(self, index: NodeIndex) -> dict[object, tuple[int | None, ...]]:
        """Cap the reserved resources at their slack; the values before, to restore."""
        saved: dict[object, tuple[int | None, ...]] = {}
        for (name, number), (milli, memory) in sorted(self.gpu_slack.items()):
            gpu = next(g for g in index.nodes[name].gpus if g.index == number)
            saved[(name, number)] = (gpu.milli_free, gpu.memory_free_mib)
            gpu.milli_free = min(gpu.milli_free, milli)
            gpu.memory_free_mib = min(gpu.memory_free_mib, memory)
        for name, (cpu, host_memory) in sorted(self.host_slack.items()):
            node = index.nodes[name]
            saved[name] = (node.cpu_free_milli, node.memory_free_mib)
            if node.cpu_free_milli is not None and cpu is not None:
                node.cpu_free_milli = min(node.cpu_free_milli, cpu)
            if node.memory_free_mib is not None and host_memory is not None:
                node.memory_free_mib = min(node.memory_free_mib, host_memory)
        self._touch(index)
        return saved

    def restore(self, index: NodeIndex, saved: dict[object, tuple[int | None, ...]]) -> None:
        """Undo `apply`, keeping (and charging to the slack) what was taken meanwhile."""
        for key, slack in sorted(self.gpu_slack.items()):
            name, number = key
            gpu = next(g for g in index.nodes[name].gpus if g.index == number)
            milli, memory = saved[key]
            assert milli is not None and memory is not None
            capped_milli, capped_memory = min(milli, slack[0]), min(memory, slack[1])
            taken_milli = capped_milli - gpu.milli_free
            taken_memory = capped_memory - gpu.memory_free_mib
            gpu.milli_free = milli - taken_milli
            gpu.memory_free_mib = memory - taken_memory
            slack[0] -= taken_milli
            slack[1] -= taken_memory
        for name, host_slack in sorted(self.host_slack.items()):
            node = index.nodes[name]
            cpu, memory = saved[name]
            if cpu is not None and node.cpu_free_milli is not None and host_slack[0] is not None:
                taken = min(cpu, host_slack[0]) - node.cpu_free_milli
                node.cpu_free_milli = cpu - taken
                host_slack[0] -= taken
            if (
                memory is not None
                and node.memory_free_mib is not None
                and host_slack[1] is not None
            ):
                taken = min(memory, host_slack[1]) - node.memory_free_mib
                node.memory_free_mib = memory - taken
                host_slack[1] -= taken
        self._touch(index)

    def _touch(self, index: NodeIndex) -> None:
        names = {name for name, _ in self.gpu_slack} | set(self.host_slack)
        for name in sorted(names):
            node = index.nodes[name]
            node.cached_state = node.cached_memory = None
            index.update(node)


def _end_order(holding: Holding) -> tuple[bool, int, int, str]:
    return (holding.ends_at is None, holding.ends_at or 0, holding.order, holding.job_id)


def _end_groups(holdings: Iterable[Holding]) -> list[list[Holding]]:
    """Holdings grouped by when they end, earliest first; those without a limit last."""
    groups: list[list[Holding]] = []
    for holding in sorted(holdings, key=_end_order):
        if groups and groups[-1][0].ends_at == holding.ends_at:
            groups[-1].append(holding)
        else:
            groups.append([holding])
    return groups


def find_reservation(
    candidate: Candidate,
    index: NodeIndex,
    holdings: Sequence[Holding],
    policy: Policy,
    context: Context,
) -> tuple[Reservation, _Protection] | None:
    """The earliest start of `candidate` as running jobs end, and the slack it leaves.

    None when it would not fit even with every running job gone (it waits for
    a node to come back, say). The search runs on a scratch copy of the views.
    """
    index = scratch(index)
    request = candidate.request
    simple = request.replicas == 1 and (request.locality == "local-only" or request.gpus == 0)
    for group in _end_groups(holdings):
        touched = release_all(index, group)
        if simple and not any(fits_locally(request, index.nodes[n]) for n in sorted(touched)):
            continue
        placement = place(request, index, policy, context)
        if placement is None:
            continue
        reservation = Reservation(candidate.job_id, group[0].ends_at, placement.replicas)
        return reservation, _slack_after(index, placement)
    return None


def _slack_after(index: NodeIndex, placement: Placement) -> _Protection:
    protection = _Protection()
    for replica in placement.replicas:
        for piece in replica.slices:
            gpu = next(g for g in index.nodes[piece.node].gpus if g.index == piece.index)
            protection.gpu_slack[(piece.node, piece.index)] = [gpu.milli_free, gpu.memory_free_mib]
        host = index.nodes[replica.host]
        protection.host_slack[replica.host] = [host.cpu_free_milli, host.memory_free_mib]
    return protection


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
    index = scratch(index)  # victims are tried on a copy (see `holdings`)
    victims = choose_victims(candidate.request, index, by_class, policy, context)
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
    lenders = [h for h in holdings if h.account != candidate.account and borrowing(h.account)]
    victims = choose_victims(candidate.request, index, lenders, policy, context)
    return (victims, "reclaim") if victims is not None else None


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
) -> list[Outcome]:
    """Walk `candidates` (queue order) once; see the module doc. Mutates `index` and `quotas`
    with what is placed; `current` is the reservation already recorded (not repeated).
    `holdings` (what runs) may be a function: it is called only if a job is blocked.

    `depth` bounds how many jobs behind the first blocked one are tried (as Slurm's
    `bf_max_job_test`): a pass over a long queue then costs a bounded time.
    """
    outcomes: list[Outcome] = []
    # what runs is only looked at once a job is blocked: built then, if given lazily
    running: list[Holding] | None = None if callable(holdings) else list(holdings)
    placed_now: list[Holding] = []

    def held() -> list[Holding]:
        nonlocal running
        if running is None:
            assert callable(holdings)
            running = list(holdings())
        return [*running, *placed_now]

    position = placed = tried_behind = 0
    blocked = preempt_tried = False
    reservation: Reservation | None = None
    protection: _Protection | None = None
    where_limited: _Where | None = None
    # A pass only ever takes resources (and the reservation's slack only shrinks), so a
    # request that found no room finds none later in the pass either: feasibility does
    # not depend on scores, so skipping it changes no decision.
    failed: set[tuple[Request, bool]] = set()
    for candidate in candidates:
        if placed >= limit:
            break
        if blocked:
            tried_behind += 1
            if depth is not None and tried_behind > depth:
                break
        if quotas is not None and quotas.why_not(
            candidate.account, candidate.demand, candidate.user or None
        ):
            continue  # held: QuotaExceeded, or AssocGrpGRES (max_gpus)
        decision = Context(context.seed, position, context.workload)
        if quotas is not None and where_limited is None:
            where_limited = _where_limited(index, quotas)
        if quotas is not None and where_limited:
            within = _within_quota(candidate, quotas, where_limited)
            if within is None:
                continue  # held: every model or pool it may use is over quota
            candidate = within
        masked = _masked(candidate, reservation, protection, now)
        if (candidate.request, masked) in failed:
            placement = None  # the same request found no room earlier in this pass
        else:
            placement = _try_place(
                candidate, index, policy, decision, protection if masked else None
            )
            if placement is None:
                failed.add((candidate.request, masked))
        if placement is not None and quotas is not None:
            quotas.take(
                candidate.account,
                {**candidate.demand, **_where_demand(index, placement)},
                candidate.user or None,
            )
        if placement is not None:
            outcomes.append(Placed(candidate, placement, blocked, position))
            position += 1
            placed += 1
            placed_now.append(_holding_of(candidate, placement, now, len(placed_now)))
            continue
        if reservation is not None:
            continue  # EASY: one reservation; this job waits
        blocked = True
        if preemption and not preempt_tried and not candidate.awaiting_victims:
            # the first blocked job alone may preempt; one whose class may not (its
            # may_preempt false) uses that turn up, so no job behind it jumps it
            preempt_tried = True
            chosen = (
                _victims_for(candidate, index, held(), quotas, policy, decision)
                if candidate.may_preempt
                else None
            )
            if chosen is not None:
                victims, reason = chosen
                outcomes.append(Preempted(candidate, victims, reason, position))
                position += len(victims)
                stopping = {v.job_id for v in victims}
                running = [
                    replace(h, stopping=True, ends_at=now) if h.job_id in stopping else h
                    for h in held()
                    if h.order < NEW_ORDER
                ]
        found = find_reservation(candidate, index, held(), policy, decision)
        if found is not None:
            reservation, protection = found
            if reservation != current:
                outcomes.append(Reserved(reservation, position))
                position += 1
        if backfill == "off":
            break
    return outcomes


def _masked(
    candidate: Candidate,
    reservation: Reservation | None,
    protection: _Protection | None,
    now: int,
) -> bool:
    """Whether the candidate must leave the reservation's slack alone: a reservation
    exists and the job may run past its start."""
    if reservation is None or protection is None:
        return False
    limit = candidate.time_limit_s
    ends_before = (
        limit is not None
        and reservation.start_at is not None
        and now + 1000 * limit <= reservation.start_at
    )
    return not ends_before


def _try_place(
    candidate: Candidate,
    index: NodeIndex,
    policy: Policy,
    context: Context,
    protection: _Protection | None,
) -> Placement | None:
    """Place the candidate; with `protection`, within the reservation's slack."""
    if protection is None:
        return place(candidate.request, index, policy, context)
    saved = protection.apply(index)
    try:
        return place(candidate.request, index, policy, context)
    finally:
        protection.restore(index, saved)


#: The cluster's GPU models and pools, or () when no model or pool quota exists.
_Where = tuple[tuple[str, ...], tuple[str, ...]] | tuple[()]


def _where_limited(index: NodeIndex, quotas: QuotaBook) -> _Where:
    """The GPU models and pools of the cluster, when some model or pool quota exists."""
    if not any(r.startswith(("model:", "pool:")) for r in quotas.trackers):
        return ()
    models = sorted({g.model for n in index.nodes.values() for g in n.gpus})
    return (tuple(models), ("physical", "vgpu"))


def _within_quota(
    candidate: Candidate,
    quotas: QuotaBook,
    where: _Where,
) -> Candidate | None:
    """The candidate restricted to the models and pools its account's quotas admit.

    Model and pool quotas depend on where a job lands, so instead of placing it and
    checking afterwards, the request is narrowed to what the quotas allow (None:
    nothing is allowed); what it then takes is charged to each after placement.
    """
    request = candidate.request
    milli = request.gpu_demand_milli * request.replicas
    if not milli or not where:
        return candidate
    models, pools = where
    wanted = request.models or models
    allowed = tuple(
        m for m in wanted if quotas.why_not(candidate.account, {f"model:{m}": milli}) is None
    )
    pool_choices = (
        ("vgpu",) if request.fractional else (pools if request.pool == "any" else (request.pool,))
    )
    open_pools = [
        p for p in pool_choices if quotas.why_not(candidate.account, {f"pool:{p}": milli}) is None
    ]
    if not allowed or not open_pools:
        return None
    pool = request.pool if len(open_pools) == len(pool_choices) else open_pools[0]
    if allowed == tuple(request.models) and pool == request.pool:
        return candidate
    narrowed = replace(
        request,
        models=allowed if len(allowed) < len(models) or request.models else (),
        pool=pool,  # type: ignore[arg-type]
    )
    return replace(candidate, request=narrowed)


def _where_demand(index: NodeIndex, placement: Placement) -> dict[str, int]:
    """Milli-GPU of the placement per GPU model and per pool (`model:<m>`, `pool:<p>`)."""
    demand: dict[str, int] = {}
    for replica in placement.replicas:
        for piece in replica.slices:
            gpu = next(g for g in index.nodes[piece.node].gpus if g.index == piece.index)
            for key in (f"model:{gpu.model}", f"pool:{gpu.pool}"):
                demand[key] = demand.get(key, 0) + piece.milli
    return demand


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

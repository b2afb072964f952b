"""Choosing preemption victims: the smallest set of jobs whose end lets a job start.

Pure: holdings in, victims out, the node views left exactly as they were. The
candidates are ordered by `victim_key` (lowest priority class first, then the
latest started, then job id) and sets are compared by size first, then by
their members' keys, so the choice is total and deterministic.

A job of one replica with local GPUs only needs victims on the node that will
host it (anything freed elsewhere is useless to it), so for it the search is
per node, exhaustive by increasing size (combinations in key order) up to a
budget: the result has the fewest victims possible. Beyond the budget, and for
gangs and remote slices, victims are added in key order until the job fits and
then every victim whose removal still lets it fit is spared: the result frees
enough and no victim is superfluous, though a smaller set may exist.

Elastic gangs shrink before anyone is stopped: the search tries their replicas first,
each a victim of its own, as many of a gang as it has past its minimum
(`placement.elastic.shrink_units`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import combinations

from gpuloom.events.accounts import GPU_MILLI
from gpuloom.placement.candidate import Candidate
from gpuloom.placement.elastic import merged_victims, shrink_units, within_surplus
from gpuloom.placement.engine import Context, NodeIndex, Policy, release
from gpuloom.placement.holdings import Holding, hold_all, release_all, scratch
from gpuloom.placement.outcomes import PreemptReason
from gpuloom.placement.resources import Request, fits_locally
from gpuloom.placement.topology import place
from gpuloom.queueing.quota import QuotaBook

#: How many victim sets the exhaustive search may try per node before it falls back.
SEARCH_BUDGET = 2000


VictimKey = tuple[int, bool, int, str, tuple[int, ...]]


def victim_key(holding: Holding) -> VictimKey:
    """Lowest priority class first; in a class, an elastic gang's replicas past its
    minimum before any whole job (it shrinks before anyone dies), the latest started
    first, its highest-numbered replicas first."""
    return (
        holding.priority_class,
        not holding.shrink,
        -holding.order,
        holding.job_id,
        tuple(-number for number in holding.numbers),
    )


def fits_after(
    request: Request,
    index: NodeIndex,
    policy: Policy,
    context: Context,
    victims: Sequence[Holding],
    host: str | None = None,
) -> bool:
    """Would `request` fit if `victims` ended (on `host` when given)? Views unchanged."""
    release_all(index, victims)
    try:
        if host is not None:
            return fits_locally(request, index.nodes[host])
        placement = place(request, index, policy, context)
        if placement is not None:
            for replica in reversed(placement.replicas):
                release(index, replica)
        return placement is not None
    finally:
        hold_all(index, list(reversed(victims)))


def choose_victims(
    request: Request,
    index: NodeIndex,
    candidates: Sequence[Holding],
    policy: Policy,
    context: Context,
    budget: int = SEARCH_BUDGET,
) -> tuple[Holding, ...] | None:
    """The victims to stop so that `request` fits; None when even all of them are not enough."""
    ordered = sorted(
        (c for c in candidates if not c.stopping and c.nodes() <= index.nodes.keys()),
        key=victim_key,
    )
    if not ordered:
        return None
    if request.replicas == 1 and (request.locality == "local-only" or request.gpus == 0):
        return _smallest_on_one_host(request, index, ordered, policy, context, budget)
    return _greedy_then_spare(
        ordered, lambda victims: fits_after(request, index, policy, context, victims)
    )


def _smallest_on_one_host(
    request: Request,
    index: NodeIndex,
    ordered: list[Holding],
    policy: Policy,
    context: Context,
    budget: int,
) -> tuple[Holding, ...] | None:
    by_host: dict[str, list[Holding]] = {}
    for holding in ordered:
        hosts = {replica.host for replica in holding.replicas}
        for host in sorted(hosts):
            by_host.setdefault(host, []).append(holding)
    best: tuple[tuple[int, tuple[VictimKey, ...], int], tuple[Holding, ...]] | None = None
    for host, here in sorted(by_host.items(), key=lambda item: index.nodes[item[0]].rank):
        rank = index.nodes[host].rank
        found = _smallest_set(
            here,
            lambda victims, host=host: fits_after(  # type: ignore[misc]
                request, index, policy, context, victims, host
            ),
            budget,
        )
        if found is None:
            continue
        score = (len(found), tuple(victim_key(v) for v in found), rank)
        if best is None or score < best[0]:
            best = (score, found)
    return best[1] if best is not None else None


def _smallest_set(
    ordered: list[Holding], fits: Callable[[Sequence[Holding]], bool], budget: int
) -> tuple[Holding, ...] | None:
    """The first set, by size then key order, for which `fits`; greedy past the budget."""
    if not fits(ordered):
        return None
    tried = 0
    for size in range(1, len(ordered) + 1):
        for victims in combinations(ordered, size):
            tried += 1
            if tried > budget:
                return _greedy_then_spare(ordered, fits)
            if fits(victims):
                return victims
    return tuple(ordered)  # pragma: no cover - fits(ordered) held above


def _greedy_then_spare(
    ordered: list[Holding], fits: Callable[[Sequence[Holding]], bool]
) -> tuple[Holding, ...] | None:
    chosen: list[Holding] = []
    for holding in ordered:
        chosen.append(holding)
        if fits(chosen):
            break
    else:
        return None
    for holding in reversed(list(chosen)):
        rest = [c for c in chosen if c is not holding]
        if rest and fits(rest):
            chosen = rest
    return tuple(chosen)


def victims_for(
    candidate: Candidate,
    index: NodeIndex,
    holdings: Sequence[Holding],
    quotas: QuotaBook | None,
    policy: Policy,
    context: Context,
) -> tuple[tuple[Holding, ...], PreemptReason] | None:
    """Whom `candidate` stops, and why: preempt by priority class first; else reclaim the
    account's nominal quota from accounts that borrow. `holdings`: what runs (none placed
    in this pass); `quotas`: the pass's book. None: nobody. Shrinking elastic gangs is
    tried first, then stopping whole jobs (`placement.elastic`)."""
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
        units = shrink_units(among)  # elastic gangs shrink before anyone is stopped
        if units:
            chosen = choose_victims(candidate.request, copies[0], units, policy, context)
            if chosen is not None and within_surplus(chosen, among):
                return merged_victims(chosen)
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

"""EASY backfill and preemption in the pure scheduling pass (`gpuloom.placement.scheduling`)."""

from __future__ import annotations

from itertools import combinations

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from gpuloom.placement.candidate import Candidate
from gpuloom.placement.engine import Context, NodeIndex, place, release
from gpuloom.placement.holdings import HeldSum, Holding, hold_all, release_all
from gpuloom.placement.incremental.released import KeptReleased
from gpuloom.placement.outcomes import Outcome, Placed, Preempted, Reserved, Waiting
from gpuloom.placement.policies import BestFit
from gpuloom.placement.preemption import choose_victims, fits_after
from gpuloom.placement.reservation import Reservation
from gpuloom.placement.resources import Request
from gpuloom.placement.scheduling import (
    Backfill,
    PassInputs,
    Rules,
    SchedulingPass,
    find_reservation,
    schedule,
)
from gpuloom.queueing.quota import Quota, QuotaBook, QuotaTracker

from .cluster import copy_nodes, gpus, node, snapshot

POLICY = BestFit()
CONTEXT = Context()
S = 1000  # one second in the scheduler's milliseconds


def cluster(count: int = 2, per_node: int = 4) -> NodeIndex:
    return NodeIndex([node(f"n{i}", i, gpus(*[1000] * per_node), cpu=32_000) for i in range(count)])


def occupy(
    index: NodeIndex, job_id: str, request: Request, ends_at: int | None, **fields: object
) -> Holding:
    placement = place(request, index, POLICY, CONTEXT)
    assert placement is not None, f"{job_id} does not fit"
    return Holding(job_id, placement.replicas, ends_at, **fields)  # type: ignore[arg-type]


def decided(
    candidates: list[Candidate],
    index: NodeIndex,
    held: list[Holding],
    *,
    now: int = 0,
    backfill: Backfill = "easy",
    quotas: QuotaBook | None = None,
    current: Reservation | None = None,
) -> list[Outcome]:
    """What a pass decides (its `Waiting` left out: see the tests of `Waiting`)."""
    inputs = PassInputs(candidates, index, CONTEXT, now, held, quotas=quotas, current=current)
    outcomes = schedule(inputs, POLICY, Rules(backfill=backfill))
    return [o for o in outcomes if not isinstance(o, Waiting)]


def whole(count: int, **fields: object) -> Request:
    return Request(gpus=count, **fields)  # type: ignore[arg-type]


def test_the_blocked_head_gets_a_reservation_when_the_earliest_jobs_end() -> None:
    index = cluster()
    held = [
        occupy(index, "long", whole(4), 100 * S),
        occupy(index, "short", whole(3), 10 * S),
    ]
    outcomes = decided([Candidate("big", whole(4), 50)], index, held, now=0)
    [reserved] = outcomes
    assert isinstance(reserved, Reserved)
    assert reserved.reservation.job_id == "big"
    assert reserved.reservation.start_at == 10 * S, "n1 frees when `short` ends"
    assert [r.host for r in reserved.reservation.replicas] == ["n1"]


def test_a_job_that_ends_before_the_reservation_backfills_and_a_long_one_waits() -> None:
    index = cluster()
    held = [
        occupy(index, "long", whole(4), 100 * S),
        occupy(index, "short", whole(3), 10 * S),
    ]
    outcomes = decided(
        [
            Candidate("big", whole(4), 50),
            Candidate("quick", whole(1), 5),  # ends at 5 s, before big starts at 10 s
            Candidate("slow", whole(1), 60),  # would hold n1's last GPU past 10 s
            Candidate("endless", whole(1), None),
        ],
        index,
        held,
        now=0,
    )
    placed = [o.candidate.job_id for o in outcomes if isinstance(o, Placed)]
    assert placed == ["quick"]
    assert all(o.backfilled for o in outcomes if isinstance(o, Placed))


def test_a_long_job_backfills_onto_resources_the_reservation_does_not_need() -> None:
    index = NodeIndex(
        [node("n0", 0, gpus(1000, 1000, 1000, 1000)), node("n1", 1, gpus(1000, 1000))]
    )
    held = [occupy(index, "a", whole(4), 10 * S)]
    outcomes = decided(
        [Candidate("big", whole(4), 50), Candidate("side", whole(2), None)],
        index,
        held,
        now=0,
    )
    placed = [
        (o.candidate.job_id, o.placement.replicas[0].host)
        for o in outcomes
        if isinstance(o, Placed)
    ]
    assert placed == [("side", "n1")]


def test_backfill_off_is_strict_order() -> None:
    index = cluster()
    held = [occupy(index, "long", whole(4), 100 * S), occupy(index, "short", whole(3), 10 * S)]
    outcomes = decided(
        [Candidate("big", whole(4), 50), Candidate("quick", whole(1), 5)],
        index,
        held,
        now=0,
        backfill="off",
    )
    assert [type(o) for o in outcomes] == [Reserved], "nothing passes the blocked head"


def test_a_recorded_reservation_is_not_written_again() -> None:
    index = cluster()
    held = [occupy(index, "long", whole(4), 100 * S), occupy(index, "short", whole(3), 10 * S)]
    found = find_reservation(Candidate("big", whole(4), 50), index, held, POLICY, CONTEXT)
    assert found is not None
    outcomes = decided(
        [Candidate("big", whole(4), 50)],
        index,
        held,
        now=0,
        current=found[0],
    )
    assert outcomes == []


def test_finding_a_reservation_leaves_the_views_as_they_were() -> None:
    index = cluster()
    held = [occupy(index, "long", whole(4), 100 * S), occupy(index, "short", whole(3), 10 * S)]
    before = snapshot(index.nodes.values())
    find_reservation(Candidate("big", whole(4), 50), index, held, POLICY, CONTEXT)
    assert snapshot(index.nodes.values()) == before


# --- the backfill property -----------------------------------------------------------------

REQUESTS = st.sampled_from(
    [
        whole(1),
        whole(2),
        whole(4),
        Request(gpus=1, gpu_milli=500),
        Request(gpus=1, gpu_milli=250, cpu_milli=8000),
        Request(gpus=0, cpu_milli=16_000),
    ]
)
LIMITS = st.one_of(st.none(), st.integers(1, 40))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    running=st.lists(st.tuples(REQUESTS, LIMITS), max_size=8),
    pending=st.lists(st.tuples(REQUESTS, LIMITS), min_size=1, max_size=10),
)
def test_no_job_is_backfilled_into_a_slot_that_delays_the_reserved_job(
    running: list[tuple[Request, int | None]], pending: list[tuple[Request, int | None]]
) -> None:
    index = cluster(3)
    held = []
    for number, (request, limit) in enumerate(running):
        placement = place(request, index, POLICY, CONTEXT)
        if placement is not None:
            ends = limit * S if limit is not None else None
            held.append(Holding(f"r{number}", placement.replicas, ends, order=number))
    candidates = [
        Candidate(f"p{number}", request, limit) for number, (request, limit) in enumerate(pending)
    ]
    outcomes = decided(candidates, index, held, now=0)
    reserved = [o for o in outcomes if isinstance(o, Reserved)]
    assert len(reserved) <= 1, "EASY: one reservation"
    if not reserved:
        return
    reservation = reserved[0].reservation
    start = reservation.start_at
    limit_of = {c.job_id: c.time_limit_s for c in candidates}
    ahead = [  # placed before the head blocked: the reservation counts on their limits too
        Holding(o.candidate.job_id, o.placement.replicas, _ends(limit_of[o.candidate.job_id]))
        for o in outcomes
        if isinstance(o, Placed) and not o.backfilled
    ]
    backfilled = [
        Holding(o.candidate.job_id, o.placement.replicas, _ends(limit_of[o.candidate.job_id]))
        for o in outcomes
        if isinstance(o, Placed) and o.backfilled
    ]
    # at the reservation's start every job that has ended by then is gone (with no known
    # start: every job that was running or placed ahead of it, whenever it ends) ...
    ended = [h for h in [*held, *ahead] if start is None or _ended(h, start)]
    ended += [h for h in backfilled if start is not None and _ended(h, start)]
    release_all(index, ended)
    # ... and the reserved job fits.
    request = next(c.request for c in candidates if c.job_id == reservation.job_id)
    assert place(request, index, POLICY, CONTEXT) is not None


def _ends(limit: int | None) -> int | None:
    return limit * S if limit is not None else None


def _ended(holding: Holding, start: int) -> bool:
    return holding.ends_at is not None and holding.ends_at <= start


# --- preemption --------------------------------------------------------------------------


def test_a_higher_class_preempts_the_fewest_preemptible_lower_jobs() -> None:
    index = cluster(2, 4)
    held = [
        occupy(index, "a", whole(1), None, preemptible=True, priority_class=0, order=1),
        occupy(index, "b", whole(3), None, preemptible=True, priority_class=0, order=2),
        occupy(index, "c", whole(2), None, preemptible=False, priority_class=0, order=3),
        occupy(index, "d", whole(2), None, preemptible=True, priority_class=5, order=4),
    ]
    outcomes = decided(
        [Candidate("urgent", whole(2), None, priority_class=3)],
        index,
        held,
        now=0,
    )
    preempted = [o for o in outcomes if isinstance(o, Preempted)]
    assert len(preempted) == 1
    assert [v.job_id for v in preempted[0].victims] == ["b"], (
        "one victim frees 2+ GPUs on n0 (b); c is not preemptible, d is a higher class"
    )
    assert preempted[0].reason == "priority"


def test_a_job_preempts_nothing_when_no_set_of_victims_is_enough() -> None:
    index = cluster(1, 4)
    held = [occupy(index, "a", whole(4), None, preemptible=False)]
    outcomes = decided(
        [Candidate("urgent", whole(2), None, priority_class=3)],
        index,
        held,
        now=0,
    )
    assert not [o for o in outcomes if isinstance(o, Preempted)]


def test_an_account_reclaims_its_nominal_quota_from_a_borrower() -> None:
    index = cluster(1, 4)
    held = [
        occupy(index, "b1", whole(2), None, account="borrower", order=1),
        occupy(index, "b2", whole(2), None, account="borrower", order=2),
    ]
    quotas = QuotaBook(
        {
            "gpu_milli": QuotaTracker(
                {"owner": Quota("org", 2000), "borrower": Quota("org", 2000, borrowing_limit=2000)},
                {"borrower": 4000},
            )
        }
    )
    outcomes = decided(
        [Candidate("mine", whole(2), None, account="owner", demand={"gpu_milli": 2000})],
        index,
        held,
        now=0,
        quotas=quotas,
    )
    [preempted] = [o for o in outcomes if isinstance(o, Preempted)]
    assert preempted.reason == "reclaim"
    assert [v.job_id for v in preempted.victims] == ["b2"], "the latest started goes first"


def test_a_job_awaiting_its_victims_preempts_no_more_and_keeps_their_place() -> None:
    index = cluster(1, 4)
    held = [
        occupy(index, "v", whole(2), 0, preemptible=True, stopping=True),
        occupy(index, "w", whole(2), None, preemptible=True, order=2),
    ]
    outcomes = decided(
        [
            Candidate("urgent", whole(2), None, priority_class=3, awaiting_victims=True),
            Candidate("other", whole(1), None),
        ],
        index,
        held,
        now=0,
    )
    assert not [o for o in outcomes if isinstance(o, Preempted)]
    [reserved] = [o for o in outcomes if isinstance(o, Reserved)]
    assert reserved.reservation.start_at == 0
    assert not [o for o in outcomes if isinstance(o, Placed)], "v's GPUs are spoken for"


SMALL = st.sampled_from([whole(1), whole(2), Request(gpus=1, gpu_milli=500), whole(3)])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    running=st.lists(st.tuples(SMALL, st.booleans()), min_size=1, max_size=8),
    wanted=SMALL,
)
def test_victims_free_enough_and_no_smaller_set_would(
    running: list[tuple[Request, bool]], wanted: Request
) -> None:
    index = cluster(2, 4)
    held = []
    for number, (request, preemptible) in enumerate(running):
        placement = place(request, index, POLICY, CONTEXT)
        if placement is not None:
            held.append(Holding(f"r{number}", placement.replicas, None, 0, preemptible, "", number))
    candidates = [h for h in held if h.preemptible]
    assume(not fits_after(wanted, index, POLICY, CONTEXT, []))  # preemption is for the blocked
    before = snapshot(index.nodes.values())
    victims = choose_victims(wanted, index, candidates, POLICY, CONTEXT)
    assert snapshot(index.nodes.values()) == before, "the views are left as they were"
    if victims is None:
        assert not fits_after(wanted, index, POLICY, CONTEXT, candidates)
        return
    assert fits_after(wanted, index, POLICY, CONTEXT, victims), "frees enough"
    for size in range(len(victims)):
        for fewer in combinations(candidates, size):
            assert not fits_after(wanted, index, POLICY, CONTEXT, fewer), (
                f"{[v.job_id for v in fewer]} would do with fewer victims"
            )
    again = choose_victims(wanted, index, list(reversed(candidates)), POLICY, CONTEXT)
    assert again == victims, "the choice does not depend on the candidates' order"


# --- giving back many holdings at once -----------------------------------------------------

SHAPES = st.sampled_from(
    [
        whole(1),
        whole(2),
        Request(gpus=1, gpu_milli=250, cpu_milli=4000, memory_mib=512),
        Request(gpus=1, gpu_milli=500),
        Request(gpus=2, replicas=2, cpu_milli=2000),
        Request(gpus=0, cpu_milli=6000, memory_mib=1024),
        Request(gpus=6, locality="any"),  # slices borrowed from other nodes
    ]
)


def lending_cluster_running(shapes: list[Request], lost: bool) -> tuple[NodeIndex, list[Holding]]:
    """Three lending nodes running `shapes` (those that fit, some borrowing slices), and a
    copy of their views without n2 when `lost` (as a cycle's views while n2 is lost)."""
    views = [
        node(f"n{i}", i, gpus(*[1000] * 4), cpu=32_000, memory=64_000, lends=True) for i in range(3)
    ]
    index = NodeIndex(views)
    held = []
    for number, request in enumerate(shapes):
        placement = place(request, index, POLICY, CONTEXT)
        if placement is not None:
            held.append(Holding(f"j{number}", placement.replicas, order=number))
    if lost:
        index = NodeIndex(copy_nodes(v for v in index.nodes.values() if v.name != "n2"))
    return index, held


@settings(max_examples=120, deadline=None)
@given(
    shapes=st.lists(SHAPES, min_size=1, max_size=14),
    ended=st.lists(st.booleans(), min_size=14, max_size=14),
    lost=st.booleans(),
)
def test_releasing_holdings_together_gives_back_what_one_by_one_does(
    shapes: list[Request], ended: list[bool], lost: bool
) -> None:
    """`release_all` sums what it gives back (the reservation search gives back every
    running job at once): the views, the nodes touched and `hold_all`'s undo are those of
    `engine.release` of each replica in turn; a replica on a node the index lacks (lost)
    is skipped whole."""
    index, held = lending_cluster_running(shapes, lost)
    chosen = [h for h, end in zip(held, ended, strict=False) if end]
    one_by_one = NodeIndex(copy_nodes(index.nodes.values()))
    touched: set[str] = set()
    for holding in chosen:
        for replica in holding.replicas:
            names = {replica.host, *(piece.node for piece in replica.slices)}
            if names <= one_by_one.nodes.keys():
                release(one_by_one, replica)
                touched |= names
    before = snapshot(index.nodes.values())
    assert release_all(index, chosen) == touched
    assert snapshot(index.nodes.values()) == snapshot(one_by_one.nodes.values())
    hold_all(index, list(reversed(chosen)))
    assert snapshot(index.nodes.values()) == before


def summed(holdings: list[Holding], passing: list[Holding] = ()) -> HeldSum:  # type: ignore[assignment]
    """`holdings` summed; each of `passing` added and taken out again on the way."""
    total = HeldSum()
    for holding in [*passing, *holdings]:
        total.add(holding)
    for holding in passing:
        total.remove(holding)
    return total


@settings(max_examples=120, deadline=None)
@given(
    shapes=st.lists(SHAPES, min_size=1, max_size=14),
    parts=st.lists(st.sampled_from(["list", "sum", "passing", "no"]), min_size=14, max_size=14),
    lost=st.booleans(),
)
def test_holdings_summed_as_they_come_and_go_give_back_what_a_list_of_them_does(
    shapes: list[Request], parts: list[str], lost: bool
) -> None:
    """`HeldSum` keeps the running jobs without an end summed from cycle to cycle: given
    back with `release_all`, a sum (some of it added and taken out again) and a list
    leave the views and touch the nodes that the list of all of them does; a replica on
    a lost node is skipped whole, one borrowing slices (spanning nodes) as well."""
    index, held = lending_cluster_running(shapes, lost)
    part = dict(zip((h.job_id for h in held), parts, strict=False))
    listed = [h for h in held if part[h.job_id] == "list"]
    total = summed(
        [h for h in held if part[h.job_id] == "sum"],
        [h for h in held if part[h.job_id] == "passing"],
    )
    everything = NodeIndex(copy_nodes(index.nodes.values()))
    expected = release_all(everything, [h for h in held if part[h.job_id] in ("list", "sum")])
    assert release_all(index, listed, total) == expected
    assert snapshot(index.nodes.values()) == snapshot(everything.nodes.values())
    fresh = summed([h for h in held if part[h.job_id] == "sum"])
    assert (total.local, total.spanning) == (fresh.local, fresh.spanning), "as if never added"


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    running=st.lists(st.tuples(REQUESTS, LIMITS, st.booleans()), max_size=8),
    blocked=REQUESTS,
)
def test_a_reservation_found_with_the_unending_jobs_summed_is_the_one_found_without(
    running: list[tuple[Request, int | None, bool]], blocked: Request
) -> None:
    """The reservation search given the running jobs without a time limit as a `HeldSum`
    (some of them, or all, the rest still listed) finds what it finds given them all."""
    index = cluster(3)
    held = []
    for number, (request, limit, _) in enumerate(running):
        placement = place(request, index, POLICY, CONTEXT)
        if placement is not None:
            held.append(Holding(f"r{number}", placement.replicas, _ends(limit), order=number))
    in_sum = {f"r{n}" for n, (_, limit, to_sum) in enumerate(running) if limit is None and to_sum}
    candidate = Candidate("big", blocked, None)
    alone = find_reservation(candidate, index, held, POLICY, CONTEXT)
    total = summed([h for h in held if h.job_id in in_sum])
    rest = [h for h in held if h.job_id not in in_sum]
    assert find_reservation(candidate, index, rest, POLICY, CONTEXT, total) == alone
    # ... and with the views as they will be once everything has ended, kept (its last step)
    released = KeptReleased().of(index, summed(held), [])
    assert released is not None
    before = snapshot(released.nodes.values())
    found = find_reservation(candidate, index, rest, POLICY, CONTEXT, total, released)
    assert found == alone
    assert snapshot(released.nodes.values()) == before, "left as it was found"


def waits(outcomes: list[Outcome]) -> dict[str, tuple[str, str]]:
    return {o.job_id: (o.code, o.detail) for o in outcomes if isinstance(o, Waiting)}


def test_every_job_the_pass_meets_and_does_not_place_waits_with_the_reason() -> None:
    """The blocked head holds the reservation; a job that fits but would outlast its start
    waits on it; a job that does not fit at all waits on resources; one over its
    account's quota on the quota."""
    index = cluster(1, 4)
    held = [occupy(index, "long", whole(2), 100 * S)]
    quotas = QuotaBook({"gpu_milli": QuotaTracker({"capped": Quota(None, 0, borrowing_limit=0)})})
    candidates = [
        Candidate("wide", whole(4), 50),
        Candidate("capped", whole(1), 5, account="capped", demand={"gpu_milli": 1000}),
        Candidate("endless", whole(1), None),
        Candidate("huge", whole(8), 5),
        Candidate("quick", whole(1), 5),
    ]
    inputs = PassInputs(candidates, index, CONTEXT, 0, held, quotas=quotas)
    outcomes = schedule(inputs, POLICY)
    found = waits(outcomes)
    assert found["wide"] == ("Resources", "no node has room for it now; it holds the reservation")
    assert found["capped"][0] == "QuotaExceeded"
    assert found["endless"][0] == "Reservation" and "it would delay wide" in found["endless"][1]
    assert found["huge"] == ("Resources", "no node has room for it now")
    assert "quick" not in found, "it ends before wide starts: it backfills"
    assert [o.candidate.job_id for o in outcomes if isinstance(o, Placed)] == ["quick"]


def test_where_the_pass_stops_it_says_why_and_until_stops_it_early() -> None:
    index = cluster(1, 4)
    held = [occupy(index, "long", whole(4), 100 * S)]
    candidates = [Candidate(f"j{i}", whole(1), None) for i in range(5)]
    walk = SchedulingPass(
        PassInputs(candidates, index, CONTEXT, 0, held), POLICY, Rules(backfill="off")
    )
    walk.run(candidates)
    assert walk.stopped is not None and "backfill off" in walk.stopped
    assert set(waits(walk.outcomes)) == {"j0"}, "the jobs behind the head are not met"
    deep = SchedulingPass(PassInputs(candidates, index, CONTEXT, 0, held), POLICY, Rules(depth=2))
    deep.run(candidates)
    assert deep.stopped is not None and "at most 2 jobs behind" in deep.stopped
    assert set(waits(deep.outcomes)) == {"j0", "j1", "j2"}
    early = SchedulingPass(
        PassInputs(candidates, index, CONTEXT, 0, held), POLICY, until=frozenset({"j1"})
    )
    early.run(candidates)
    assert early.stopped is None and set(waits(early.outcomes)) == {"j0", "j1"}

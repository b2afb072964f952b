"""Each policy's score on small hand-made nodes, against the formulas of EVALUATION.md §3
(worked numbers, and an exact-fraction transcription of each formula)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable
from fractions import Fraction

import pytest

from gpuloom.placement.engine import Context, NodeIndex, place
from gpuloom.placement.fragmentation import Shape, Workload
from gpuloom.placement.policies import (
    FGD,
    MAX_CPU_MILLI,
    MAX_GPU_MILLI,
    BestFit,
    DotProd,
    Loom,
    Pack,
    Random,
    Spread,
    shipped_policies,
)
from gpuloom.placement.resources import NodeView, Request

from .cluster import gpu, gpus, hosts_of, layout, node, place_on

WHOLE_1 = Request(gpus=1, cpu_milli=4000)


def spec_bestfit_raw(node_: NodeView, request: Request) -> int:
    """⌊100·(1 - [0.5·(c_n - c)/MaxCPU + 0.5·(g_n - k·s)/MaxGPU])⌋, exactly."""
    c_n = node_.cpu_free_milli or 0
    g_n = sum(g.milli_free for g in node_.gpus)
    left = Fraction(c_n - request.cpu_milli, 2 * MAX_CPU_MILLI) + Fraction(
        g_n - request.gpus * request.gpu_milli, 2 * MAX_GPU_MILLI
    )
    return math.floor(100 * (1 - left))


def spec_dotprod(node_: NodeView, request: Request) -> int:
    """⌊100·(1 - a·d/2)⌋, a = (c_n/MaxCPU, g_n/MaxGPU), d = (c/MaxCPU, k·s/MaxGPU)."""
    c_n = node_.cpu_free_milli or 0
    g_n = sum(g.milli_free for g in node_.gpus)
    dot = Fraction(c_n * request.cpu_milli, MAX_CPU_MILLI**2) + Fraction(
        g_n * request.gpus * request.gpu_milli, MAX_GPU_MILLI**2
    )
    return math.floor(100 * (1 - dot / 2))


# --- bestfit / spread ---------------------------------------------------------------------


def three_nodes() -> list[NodeView]:
    return [
        node("a", 2, gpus(1000, 1000), cpu=8000),  # 4000 CPU, 1000 milli left
        node("b", 0, gpus(*[1000] * 8), cpu=64000),  # 60000 CPU, 7000 milli left
        node("c", 1, gpus(1000, 500), cpu=20000),  # 16000 CPU, 500 milli left
    ]


def test_bestfit_raw_scores_match_the_formula_with_worked_numbers() -> None:
    a, b, c = three_nodes()
    policy, ctx = BestFit(), Context()
    # a: 100·(1 - (0.5·4000/128000 + 0.5·1000/8000)) = 100·(1 - 0.078125) = 92.1875
    assert policy.score(a, WHOLE_1, ctx) == 92
    # b: 100·(1 - (0.234375 + 0.4375)) = 32.8125
    assert policy.score(b, WHOLE_1, ctx) == 32
    # c: 100·(1 - (0.0625 + 0.03125)) = 90.625
    assert policy.score(c, WHOLE_1, ctx) == 90
    for n in (a, b, c):
        assert policy.score(n, WHOLE_1, ctx) == spec_bestfit_raw(n, WHOLE_1)


def test_bestfit_raw_score_floors_below_zero_and_above_one_hundred() -> None:
    policy, ctx = BestFit(), Context()
    huge = node("h", 0, gpus(*[1000] * 16), cpu=300_000)
    # 100·(1 - (0.5·300000/128000 + 0.5·16000/8000)) = -117.1875: floored, not truncated
    assert policy.score(huge, Request(), ctx) == -118 == spec_bestfit_raw(huge, Request())
    # an undeclared CPU counts as 0 free: the leftover is negative and the score above 100
    bare = node("x", 0, gpus(1000), cpu=None)
    request = Request(gpus=1, cpu_milli=1000)
    assert policy.score(bare, request, ctx) == spec_bestfit_raw(bare, request) == 100
    request = Request(gpus=1, cpu_milli=64000)
    assert policy.score(bare, request, ctx) == spec_bestfit_raw(bare, request) == 125


def test_bestfit_normalize_is_min_max_floor() -> None:
    policy = BestFit()
    # ⌊(raw - lo)·100/(hi - lo)⌋ with lo = 32, hi = 92
    assert policy.normalize([92, 32, 90]) == [100, 0, 96]
    assert policy.normalize([7, 7, 7]) == [0, 0, 0]
    assert policy.normalize([5]) == [0]
    assert policy.normalize([-118, 100, 0]) == [0, 100, 54]


def test_bestfit_chooses_the_least_leftover_and_breaks_ties_by_rank() -> None:
    assert hosts_of(place_on(WHOLE_1, three_nodes(), BestFit())) == ["a"]
    # equal raw scores normalise to 0 everywhere: the lowest rank wins
    twins = [node("x", 1, gpus(1000), cpu=8000), node("y", 0, gpus(1000), cpu=8000)]
    assert hosts_of(place_on(WHOLE_1, twins, BestFit())) == ["y"]


def test_spread_is_bestfit_mirrored() -> None:
    nodes = three_nodes()
    for n in nodes:
        assert Spread().score(n, WHOLE_1, Context()) == -BestFit().score(n, WHOLE_1, Context())
    assert hosts_of(place_on(WHOLE_1, nodes, Spread())) == ["b"]


# --- dotprod -----------------------------------------------------------------------------


def test_dotprod_matches_the_formula_and_prefers_the_smallest_dot_product() -> None:
    small = node("small", 1, gpus(1000, 1000), cpu=8000)
    big = node("big", 0, gpus(*[1000] * 8), cpu=64000)
    policy, ctx = DotProd(), Context()
    # small: a·d = 8000·4000/128000² + 2000·1000/8000² = 0.033203125 -> 100·(1 - a·d/2) = 98.34
    assert policy.score(small, WHOLE_1, ctx) == 98
    # big: a·d = 0.015625 + 0.125 = 0.140625 -> 92.97
    assert policy.score(big, WHOLE_1, ctx) == 92
    for n in (small, big):
        assert policy.score(n, WHOLE_1, ctx) == spec_dotprod(n, WHOLE_1)
    assert policy.normalize([98, 92]) == [98, 92]  # no normalisation
    assert hosts_of(place_on(WHOLE_1, [small, big], policy)) == ["small"]


def test_dotprod_floors_fractional_demand_exactly() -> None:
    request = Request(gpus=1, gpu_milli=333, cpu_milli=1234)
    for cpu, free in [(1000, (1000,)), (127_000, (1000, 17, 999)), (None, (500, 500))]:
        n = node("n", 0, gpus(*free), cpu=cpu)
        assert DotProd().score(n, request, Context()) == spec_dotprod(n, request)


# --- pack (GpuPacking) --------------------------------------------------------------------


@pytest.mark.parametrize(("count", "expected"), [(1, 32), (2, 31), (8, 25), (16, 17), (20, 20)])
def test_pack_case_i_empty_node_scores_max_33_minus_count_count(count: int, expected: int) -> None:
    empty = node("e", 0, gpus(*[1000] * count))
    assert Pack().score(empty, Request(gpus=1), Context()) == expected
    assert Pack().score(empty, Request(gpus=1, gpu_milli=300), Context()) == expected


def test_pack_case_ii_used_node_with_whole_free_gpus() -> None:
    used = node("u", 0, gpus(1000, 1000, 700, 1000))
    # k whole GPUs, all j = k of the picked ones fully free: max(50 - j, 33)
    assert Pack().score(used, Request(gpus=1), Context()) == 49
    assert Pack().score(used, Request(gpus=3), Context()) == 47
    # a fraction that only fits on an idle GPU (ascending free order: 1000 first)
    assert Pack().score(used, Request(gpus=1, gpu_milli=800), Context()) == 49
    many = node("m", 0, [*gpus(*[1000] * 20), gpu(20, free=0)])
    assert Pack().score(many, Request(gpus=8), Context()) == 42
    assert Pack().score(many, Request(gpus=20), Context()) == 33  # floor of the case


def test_pack_case_iii_only_shared_gpus_picked() -> None:
    shared = node("s", 0, gpus(600, 200, 1000))
    # the fullest GPU with free >= s: 200 -> Σ⌊free·100/1000⌋ = 20 -> 100 - ⌊20/10⌋ = 98
    assert Pack().score(shared, Request(gpus=1, gpu_milli=100), Context()) == 98
    # s = 300: 600 is picked -> 60 -> 94
    assert Pack().score(shared, Request(gpus=1, gpu_milli=300), Context()) == 94
    # both floors: ⌊555·100/1000⌋ = 55, ⌊55/10⌋ = 5 -> 95
    assert Pack().score(node("f", 0, gpus(555, 0)), Request(gpus=1, gpu_milli=500), Context()) == 95
    # two slices: 20 + 60 = 80 -> 92
    assert Pack().score(shared, Request(gpus=2, gpu_milli=100), Context()) == 92
    # the lower bound 50: six GPUs at 900 give Σ = 540 -> 100 - 54 = 46 -> 50
    busy = node("b", 0, gpus(*[900] * 6))
    assert Pack().score(busy, Request(gpus=6, gpu_milli=100), Context()) == 50


def test_pack_cpu_only_scores_zero_so_rank_decides() -> None:
    nodes = [node("x", 1, gpus(1000, 500)), node("y", 0, gpus(1000))]
    for n in nodes:
        assert Pack().score(n, Request(cpu_milli=100), Context()) == 0
    assert hosts_of(place_on(Request(cpu_milli=100), nodes, Pack())) == ["y"]


def test_pack_prefers_shared_gpus_then_used_nodes_then_the_smallest_empty_node() -> None:
    def cluster() -> list[NodeView]:
        return [
            node("empty8", 0, gpus(*[1000] * 8)),
            node("empty2", 1, gpus(1000, 1000)),
            node("used", 2, gpus(1000, 0, 0, 0)),
            node("shared", 3, gpus(400, 1000)),
        ]

    fraction = Request(gpus=1, gpu_milli=300)
    assert layout(place_on(fraction, cluster(), Pack())) == [("shared", (("shared", 0, 300),))]
    assert hosts_of(place_on(Request(gpus=1), cluster(), Pack())) == ["used"]  # 49 vs 48
    assert hosts_of(place_on(Request(gpus=2), cluster(), Pack())) == ["empty2"]  # 31 vs 25


# --- random ------------------------------------------------------------------------------


def four_nodes() -> list[NodeView]:
    return [node(f"n{r}", r, gpus(1000, 600, 600, 600)) for r in range(4)]


def test_random_is_seeded_and_reproducible() -> None:
    request = Request(gpus=1, gpu_milli=300)

    def run(seed: int) -> list[object]:
        nodes = four_nodes()
        index = NodeIndex(nodes)
        return [
            layout(place(request, index, Random(), Context(seed=seed, position=p)))
            for p in range(40)
        ]

    assert run(7) == run(7)
    assert run(7) != run(8)
    # the score is a pure function of (seed, position, rank)
    n = four_nodes()[2]
    ctx = Context(seed=3, position=9)
    assert Random().score(n, request, ctx) == Random().score(n, request, ctx)
    assert Random().grouped is False


def test_random_spreads_choices_over_every_feasible_node_and_gpu() -> None:
    request = Request(gpus=1, gpu_milli=300)
    hosts: Counter[str] = Counter()
    picked: Counter[int] = Counter()
    for position in range(2000):
        nodes = four_nodes()
        placement = place_on(request, nodes, Random(), Context(seed=42, position=position))
        assert placement is not None
        hosts[placement.replicas[0].host] += 1
        picked[placement.replicas[0].slices[0].index] += 1
    assert set(hosts) == {"n0", "n1", "n2", "n3"}
    assert all(350 <= count <= 650 for count in hosts.values()), hosts
    # a fraction goes to a uniformly random serving GPU, not the best-fitting one
    assert set(picked) == {0, 1, 2, 3}
    assert all(350 <= count <= 650 for count in picked.values()), picked


def test_random_takes_the_lowest_idle_gpus_for_whole_requests() -> None:
    for position in range(20):
        nodes = [node(f"n{r}", r, gpus(600, 1000, 0, 1000, 1000)) for r in range(3)]
        placement = place_on(Request(gpus=2), nodes, Random(), Context(seed=1, position=position))
        assert placement is not None
        assert [s.index for s in placement.replicas[0].slices] == [1, 3]


# --- fgd and loom ------------------------------------------------------------------------


class FixedDelta(FGD):
    """FGD with its Δ numerator fixed, to check the score's sigmoid bucketing alone."""

    def __init__(self, numerator: int) -> None:
        super().__init__()
        self.numerator = numerator

    def best_choice(self, node_, request, context):  # type: ignore[no-untyped-def]
        return self.numerator, []


def weights(*pairs: tuple[Shape, int]) -> Workload:
    return Workload(tuple(pairs))


CPU_ONLY = Shape(0, 0, 0)
ONE_WHOLE = Shape(0, 1000, 1)


@pytest.mark.parametrize(
    ("delta_milli", "expected"),
    [(0, 50), (100, 47), (500, 37), (-300, 57), (-100, 52), (40, 49), (-40, 50), (5000, 0)],
)
def test_fgd_score_is_floor_100_sigmoid_minus_delta_over_1000(
    delta_milli: int, expected: int
) -> None:
    workload = weights((CPU_ONLY, 3), (ONE_WHOLE, 1))  # total 4: Δ numerator = 4·Δ milli
    ctx = Context(workload=workload)
    score = FixedDelta(4 * delta_milli).score(node("n", 0), Request(gpus=1), ctx)
    assert score == expected == math.floor(100 / (1 + math.exp(delta_milli / 1000)))


def test_fgd_end_to_end_deltas_give_the_published_anchor_scores() -> None:
    two_idle = [gpu(0), gpu(1)]
    # a whole GPU out of two, against "one whole GPU" tasks: no new fragment, Δ = 0 -> 50
    ctx = Context(workload=weights((ONE_WHOLE, 1)))
    assert FGD().score(node("n", 0, two_idle), Request(gpus=1), ctx) == 50
    # half a GPU on an idle GPU against the same workload: 500 become a fragment -> 37
    assert FGD().score(node("n", 0, two_idle), Request(gpus=1, gpu_milli=500), ctx) == 37
    # CPU-only + whole shapes (1:1): 400 milli taken -> Δ = (-400 + 600)/2 = +100 -> 47
    ctx = Context(workload=weights((CPU_ONLY, 1), (ONE_WHOLE, 1)))
    assert FGD().score(node("n", 0, two_idle), Request(gpus=1, gpu_milli=400), ctx) == 47
    # CPU-only workload: every milli taken shrinks the fragment, Δ = -300 -> 57
    ctx = Context(workload=weights((CPU_ONLY, 1)))
    assert FGD().score(node("n", 0, two_idle), Request(gpus=1, gpu_milli=300), ctx) == 57


def test_fgd_picks_the_gpu_with_the_smallest_delta_first_index_on_ties() -> None:
    ctx = Context(workload=weights((ONE_WHOLE, 1)))
    request = Request(gpus=1, gpu_milli=100)
    # GPU 0 idle, GPUs 1 and 2 with 200 free: a slice on 1 or 2 shrinks the fragment by 100;
    # on GPU 0 it would create a 900 fragment. Tie between 1 and 2 -> the first.
    n = node("n", 0, gpus(1000, 200, 200))
    delta, chosen = FGD().best_choice(n, request, ctx)
    assert [g.index for g in chosen] == [1]
    assert delta == -100
    assert [g.index for g in FGD().pick(n, request, ctx)] == [1]
    # a whole request takes the lowest idle GPUs
    n = node("n", 0, gpus(200, 1000, 1000))
    assert [g.index for g in FGD().pick(n, Request(gpus=2), ctx)] == [1, 2]


def test_fgd_buckets_near_deltas_together_and_rank_decides() -> None:
    # p(shape s=300) = 1/10, p(CPU-only) = 9/10; a 100 milli slice:
    #   "near" [400 free] -> 300, still fits the shape: Δ = 9·(-100)/10 = -90 milli
    #   "far"  [150 free] -> 50, was a fragment already: Δ = (-100 + 9·(-100))/10 = -100 milli
    workload = weights((Shape(0, 300, 1), 1), (CPU_ONLY, 9))
    ctx = Context(workload=workload)
    request = Request(gpus=1, gpu_milli=100)

    def cluster() -> list[NodeView]:
        return [node("near", 0, gpus(400)), node("far", 1, gpus(150))]

    near, far = cluster()
    assert FGD().best_choice(near, request, ctx)[0] == -900
    assert FGD().best_choice(far, request, ctx)[0] == -1000
    assert FGD().score(near, request, ctx) == FGD().score(far, request, ctx) == 52
    assert hosts_of(place_on(request, cluster(), FGD(), ctx)) == ["near"]  # tie -> rank
    # loom (v3): the same bucket, doubled, +1 for a node holding work (both do here)
    loom = Loom.version_3
    assert loom().score(near, request, ctx) == loom().score(far, request, ctx) == 52 * 2 + 1
    assert hosts_of(place_on(request, cluster(), loom(), ctx)) == ["near"]


def test_loom_prefers_a_used_node_inside_a_bucket() -> None:
    ctx = Context(workload=weights((ONE_WHOLE, 1)))

    # both give Δ = 0 for one whole GPU; FGD takes the lower rank, loom the used node
    def fresh() -> list[NodeView]:
        return [node("idle", 0, gpus(1000, 1000, 1000)), node("used", 1, gpus(1000, 1000, 0))]

    nodes = fresh()
    request = Request(gpus=1)
    assert Loom().best_choice(nodes[0], request, ctx)[0] == 0
    assert Loom().best_choice(nodes[1], request, ctx)[0] == 0
    assert Loom().score(nodes[0], request, ctx) == 50 * 2
    assert Loom().score(nodes[1], request, ctx) == 50 * 2 + 1
    assert hosts_of(place_on(request, fresh(), FGD(), ctx)) == ["idle"]
    assert hosts_of(place_on(request, fresh(), Loom(), ctx)) == ["used"]


def test_loom_still_follows_the_gradient_across_buckets() -> None:
    ctx = Context(workload=weights((ONE_WHOLE, 1)))
    # a 500 slice: on the used node's half-free GPU it removes a fragment (Δ = -500), on
    # the idle node it makes one (+500): the gradient wins over "used"
    nodes = [node("used", 0, gpus(1000, 500)), node("idle", 1, gpus(1000, 1000))]
    request = Request(gpus=1, gpu_milli=500)
    assert hosts_of(place_on(request, nodes, Loom(), ctx)) == ["used"]
    nodes = [node("idle", 0, gpus(1000, 1000)), node("used", 1, gpus(1000, 600))]
    # on "used" the 600 piece becomes 100 (a fragment, +100 net vs the 600 that was one)...
    delta_used = Loom().best_choice(nodes[1], request, ctx)[0]
    delta_idle = Loom().best_choice(nodes[0], request, ctx)[0]
    assert delta_used < delta_idle
    assert hosts_of(place_on(request, nodes, Loom(), ctx)) == ["used"]


@pytest.mark.parametrize("policy", [FGD(), Loom()], ids=["fgd", "loom"])
def test_fragmentation_policies_need_a_workload(policy: FGD) -> None:
    with pytest.raises(ValueError, match="typical workload"):
        policy.score(node("n", 0, gpus(1000)), Request(gpus=1), Context())


def test_shipped_policies_are_named_and_grouped_except_random() -> None:
    policies = shipped_policies()
    assert [p.name for p in policies] == [
        "bestfit",
        "spread",
        "dotprod",
        "pack",
        "random",
        "fgd",
        "loom",
    ]
    assert [p.grouped for p in policies] == [True, True, True, True, False, True, True]
    assert all(p.params == {} for p in policies if p.name != "loom")
    assert policies[-1].params == {
        "temperature_milli": 1000,
        "prefer_used_nodes": True,
        "scarce_pressure": "3/10",
        "gap_competition": "1/5",
        "stranding_weight": "1/1",
    }
    assert Loom.version_4().params == {
        "temperature_milli": 1000,
        "prefer_used_nodes": True,
        "scarce_pressure": "3/10",
        "gap_competition": "1/5",
    }
    assert Loom.version_3().params == {
        "temperature_milli": 1000,
        "prefer_used_nodes": True,
        "scarce_pressure": "3/10",
    }
    assert Loom.version_2().params == {"temperature_milli": 1000, "prefer_used_nodes": True}


def memory_twins() -> list[NodeView]:
    """Equal fragmentation states (model, pool, milli free), different GPU memory: with
    1100 MiB asked, "x" can only use its idle GPU and "y" only its 600-milli one."""
    return [
        node("x", 0, [gpu(0, memory=2000), gpu(1, memory=1000, free=600)]),
        node("y", 1, [gpu(0, memory=1000), gpu(1, memory=2000, free=600)]),
    ]


@pytest.mark.parametrize(
    ("make", "gaps"), [(FGD, (0, 0)), (Loom.version_3, (0, 0)), (Loom, (333, -500))]
)
def test_fragmentation_policies_see_gpu_memory_per_node(
    make: Callable[[], FGD], gaps: tuple[int, int]
) -> None:
    ctx = Context(workload=weights((ONE_WHOLE, 1)))
    request = Request(gpus=1, gpu_milli=500, gpu_memory_mib=1100)
    x, y = memory_twins()
    # x: its idle GPU -> 500 becomes a fragment (Δ = +500); y: 600 -> 100 (Δ = -500)
    # loom v4 adds the gaps' values, W(f) = f where nothing fits and W(1000) = 167:
    # x 167 -> 500 (+333), y 600 -> 100 (-500)
    assert make().best_choice(x, request, ctx)[0] == 500 + gaps[0]
    assert make().best_choice(y, request, ctx)[0] == -500 + gaps[1]
    assert make().score(y, request, ctx) > make().score(x, request, ctx)


@pytest.mark.parametrize("policy_type", [FGD, Loom], ids=["fgd", "loom"])
def test_fragmentation_policy_memo_does_not_mix_nodes_with_different_memory(
    policy_type: type[FGD],
) -> None:
    ctx = Context(workload=weights((ONE_WHOLE, 1)))
    request = Request(gpus=1, gpu_milli=500, gpu_memory_mib=1100)
    policy = policy_type()
    x, y = memory_twins()
    assert policy.score(x, request, ctx) == policy_type().score(x, request, ctx)
    assert policy.score(y, request, ctx) == policy_type().score(y, request, ctx)
    assert hosts_of(place_on(request, memory_twins(), policy_type(), ctx)) == ["y"]


@pytest.mark.parametrize("policy_type", [FGD, Loom], ids=["fgd", "loom"])
def test_fragmentation_policies_place_a_fraction_on_a_remote_vgpu(
    policy_type: type[FGD],
) -> None:
    ctx = Context(workload=weights((ONE_WHOLE, 1), (Shape(0, 500, 1), 1)))
    nodes = [
        node("host", 0, [], cpu=8000),  # room for the replica, no GPU of its own
        node("lender", 1, gpus(1000), cpu=0, lends=True),
    ]
    request = Request(gpus=1, gpu_milli=500, cpu_milli=1000, locality="local-first")
    placement = place_on(request, nodes, policy_type(), ctx)
    assert layout(placement) == [("host", (("lender", 0, 500),))]


@pytest.mark.parametrize("policy", shipped_policies()[:5], ids=lambda p: p.name)
def test_other_policies_place_a_fraction_on_a_remote_vgpu(policy: BestFit) -> None:
    nodes = [
        node("host", 0, [], cpu=8000),
        node("lender", 1, gpus(1000), cpu=0, lends=True),
    ]
    request = Request(gpus=1, gpu_milli=500, cpu_milli=1000, locality="local-first")
    assert layout(place_on(request, nodes, policy)) == [("host", (("lender", 0, 500),))]


def test_loom_v3_leaves_a_used_node_of_a_scarce_model_to_the_tasks_bound_to_it() -> None:
    """Both T4 nodes give the same Δ; "used" holds work, but T4 is scarce: a GPU task free
    to run anywhere goes by rank (as FGD), one bound to T4 and a task with no GPU still
    prefer the node in use; version 2 prefers it for all."""
    bound = Shape(0, 1000, 1, frozenset({"T4"}))
    scarce = Workload(((ONE_WHOLE, 1), (bound, 1)), scarce=frozenset({"T4"}))
    ctx = Context(workload=scarce)

    def fresh() -> list[NodeView]:
        return [
            node("idle", 0, gpus(1000, 1000, 1000, model="T4"), cpu=64_000),
            node("used", 1, gpus(1000, 1000, 0, model="T4"), cpu=64_000),
        ]

    anywhere, for_t4, no_gpu = Request(gpus=1), Request(gpus=1, models=("T4",)), Request()
    idle, used = fresh()
    for request in (anywhere, for_t4, no_gpu):
        assert Loom().delta(idle, request, ctx) == Loom().delta(used, request, ctx)
    assert Loom().score(used, anywhere, ctx) == Loom().score(idle, anywhere, ctx)
    assert Loom().score(used, no_gpu, ctx) == Loom().score(idle, no_gpu, ctx) + 1
    assert Loom.version_2().score(used, anywhere, ctx) == Loom().score(idle, anywhere, ctx) + 1
    assert hosts_of(place_on(anywhere, fresh(), Loom(), ctx)) == ["idle"]
    assert hosts_of(place_on(anywhere, fresh(), Loom.version_2(), ctx)) == ["used"]
    assert hosts_of(place_on(for_t4, fresh(), Loom(), ctx)) == ["used"]
    assert hosts_of(place_on(no_gpu, fresh(), Loom(), ctx)) == ["used"]
    # the same workload with no model scarce: loom prefers the node in use again
    plenty = Context(workload=Workload(scarce.shapes))
    assert hosts_of(place_on(anywhere, fresh(), Loom(), plenty)) == ["used"]

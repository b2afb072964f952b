"""The rules every policy shares: best-fit GPU choice, pools, models, node selectors,
CPU/memory filters, gangs (all or nothing) and remote vGPU."""

from __future__ import annotations

from typing import Any

import pytest

from gpuloom.placement.engine import Context, NodeIndex, place
from gpuloom.placement.policies import BestFit, Pack, shipped_policies
from gpuloom.placement.resources import (
    NodeView,
    Request,
    best_fit_gpus,
    fits_locally,
    gpu_serves,
    host_fits,
)

from .cluster import (
    copy_nodes,
    gpu,
    gpus,
    hosts_of,
    layout,
    node,
    place_on,
    reference_host,
    snapshot,
)

FRACTION = Request(gpus=1, gpu_milli=300)
POLICIES = shipped_policies()
POLICY_IDS = [p.name for p in POLICIES]


def ctx_for(policy: object) -> Context:
    from gpuloom.placement.fragmentation import Shape, Workload

    shapes = [Shape(0, 1000, 1), Shape(0, 300, 1), Shape(1000, 0, 0)]
    return Context(seed=5, workload=Workload.typical(shapes))


# --- request helpers ---------------------------------------------------------------------


def test_request_memory_share_and_demand() -> None:
    big = gpu(0, memory=1001)
    assert Request(gpus=1, gpu_milli=333).memory_for(big) == 334  # ceiling share
    assert Request(gpus=1, gpu_milli=500).memory_for(gpu(0, memory=1000)) == 500
    assert Request(gpus=1).memory_for(big) == 1001  # whole: all of it
    assert Request(gpus=1, gpu_milli=300, gpu_memory_mib=7).memory_for(big) == 7
    assert Request(gpus=3, gpu_milli=250).gpu_demand_milli == 750
    assert Request(gpus=1, gpu_milli=999).fractional
    assert not Request(gpus=1).fractional


# --- best-fit GPU choice -----------------------------------------------------------------


def test_best_fit_fraction_goes_to_the_fullest_gpu_that_still_fits() -> None:
    n = node("n", 0, gpus(1000, 400, 250, 300, 300, 100))
    assert [g.index for g in best_fit_gpus(FRACTION, n)] == [3]  # 300 (tie 3/4 -> 3)
    two = Request(gpus=2, gpu_milli=250)
    assert [g.index for g in best_fit_gpus(two, n)] == [2, 3]
    assert layout(place_on(FRACTION, [n], BestFit())) == [("n", (("n", 3, 300),))]
    assert n.gpus[3].milli_free == 0 and n.gpus[3].memory_free_mib == 0


def test_best_fit_whole_takes_the_lowest_indexed_idle_gpus() -> None:
    n = node("n", 0, gpus(999, 1000, 0, 1000, 1000))
    assert [g.index for g in best_fit_gpus(Request(gpus=2), n)] == [1, 3]
    # a vGPU with its compute free but some memory taken is not idle
    m = node("m", 0, [gpu(0, memory_free=900), gpu(1)])
    assert [g.index for g in best_fit_gpus(Request(gpus=1), m)] == [1]


@pytest.mark.parametrize("policy", POLICIES, ids=POLICY_IDS)
def test_every_policy_picks_best_fit_gpus_for_whole_requests(policy: BestFit) -> None:
    n = node("n", 0, gpus(500, 1000, 1000, 0, 1000))
    placement = place_on(Request(gpus=2), [n], policy, ctx_for(policy))
    assert layout(placement) == [("n", (("n", 1, 1000), ("n", 2, 1000)))]
    assert [g.milli_free for g in n.gpus] == [500, 0, 0, 0, 1000]
    assert [g.memory_free_mib for g in n.gpus] == [500, 0, 0, 0, 1000]


# --- pools -------------------------------------------------------------------------------


def test_fraction_never_goes_on_a_physical_gpu() -> None:
    physical = gpu(0, "physical")
    assert not gpu_serves(FRACTION, physical)
    assert not gpu_serves(Request(gpus=1, gpu_milli=300, pool="any"), physical)
    for policy in POLICIES:
        n = node("p", 0, gpus(1000, 1000, pool="physical"))
        assert place_on(FRACTION, [n], policy, ctx_for(policy)) is None
        mixed = node("m", 0, [gpu(0, "physical"), gpu(1, "vgpu")])
        placement = place_on(FRACTION, [mixed], policy, ctx_for(policy))
        assert layout(placement) == [("m", (("m", 1, 300),))]
        assert mixed.gpus[0].idle


def test_a_fraction_asking_for_the_physical_pool_is_never_placed() -> None:
    n = node("n", 0, [gpu(0, "physical"), gpu(1, "vgpu")])
    assert place_on(Request(gpus=1, gpu_milli=300, pool="physical"), [n], BestFit()) is None


def test_pool_physical_never_takes_vgpu_and_pool_vgpu_never_takes_physical() -> None:
    vgpu_only = node("v", 0, gpus(1000, 1000))
    assert place_on(Request(gpus=1, pool="physical"), [vgpu_only], BestFit()) is None
    physical_only = node("p", 0, gpus(1000, pool="physical"))
    assert place_on(Request(gpus=1, pool="vgpu"), [physical_only], BestFit()) is None
    mixed = node("m", 0, [gpu(0, "vgpu"), gpu(1, "physical"), gpu(2, "vgpu"), gpu(3, "physical")])
    placement = place_on(Request(gpus=2, pool="physical"), [mixed], BestFit())
    assert layout(placement) == [("m", (("m", 1, 1000), ("m", 3, 1000)))]
    placement = place_on(Request(gpus=2, pool="vgpu"), [mixed], BestFit())
    assert layout(placement) == [("m", (("m", 0, 1000), ("m", 2, 1000)))]
    assert all(g.milli_free == 0 and g.memory_free_mib == 0 for g in mixed.gpus)


def test_a_physical_gpu_is_taken_whole_with_all_its_memory() -> None:
    n = node("n", 0, [gpu(0, "physical", memory=81920)])
    placement = place_on(Request(gpus=1, pool="any"), [n], BestFit())
    assert placement is not None
    assert placement.replicas[0].slices[0].memory_mib == 81920
    assert (n.gpus[0].milli_free, n.gpus[0].memory_free_mib) == (0, 0)


def test_a_whole_vgpu_needs_an_idle_gpu_and_is_a_full_slice() -> None:
    n = node("n", 0, gpus(999, 1000))
    placement = place_on(Request(gpus=1, pool="vgpu"), [n], BestFit())
    assert layout(placement) == [("n", (("n", 1, 1000),))]
    assert place_on(Request(gpus=1, pool="vgpu"), [n], BestFit()) is None


def test_whole_gpu_request_with_more_memory_than_the_gpu_is_refused() -> None:
    n = node("n", 0, [gpu(0, "physical", memory=1000)])
    placement = place_on(Request(gpus=1, gpu_memory_mib=5000), [n], BestFit())
    assert n.gpus[0].memory_free_mib >= 0
    assert placement is None


# --- models, selectors, CPU and memory ---------------------------------------------------


def test_model_constraint_filters_gpus_and_nodes() -> None:
    request = Request(gpus=1, gpu_milli=300, models=("H100",))
    a_only = node("a", 0, gpus(1000, 1000, model="A100"))
    assert not fits_locally(request, a_only)
    assert place_on(request, [a_only], BestFit()) is None
    mixed = node("m", 1, [gpu(0, model="A100", free=300), gpu(1, model="H100")])
    placement = place_on(request, [a_only, mixed], BestFit())
    assert layout(placement) == [("m", (("m", 1, 300),))]
    either = Request(gpus=2, models=("A100", "H100"))
    assert layout(
        place_on(either, [node("m", 0, [gpu(0, model="A100"), gpu(1, model="H100")])], BestFit())
    ) == [("m", (("m", 0, 1000), ("m", 1, 1000)))]


def test_node_selector_must_match_every_label() -> None:
    nodes = [
        node("plain", 0, gpus(1000)),
        node("zone-a", 1, gpus(1000), labels={"zone": "a"}),
        node("zone-a-ssd", 2, gpus(1000), labels={"zone": "a", "disk": "ssd"}),
    ]
    request = Request(gpus=1, node_selector=(("zone", "a"), ("disk", "ssd")))
    assert [n.name for n in nodes if host_fits(request, n)] == ["zone-a-ssd"]
    assert hosts_of(place_on(request, nodes, BestFit())) == ["zone-a-ssd"]
    wrong = Request(gpus=1, node_selector=(("zone", "b"),))
    assert place_on(wrong, nodes, BestFit()) is None


def test_cpu_and_memory_filter_hosts_and_are_taken() -> None:
    request = Request(gpus=1, cpu_milli=4000, memory_mib=8000)
    nodes = [
        node("low-cpu", 0, gpus(1000), cpu=3999, memory=100_000),
        node("low-mem", 1, gpus(1000), cpu=100_000, memory=7999),
        node("exact", 2, gpus(1000), cpu=4000, memory=8000),
        node("undeclared", 3, gpus(1000)),
    ]
    assert [n.name for n in nodes if host_fits(request, n)] == ["exact", "undeclared"]
    placement = place_on(request, nodes, Pack())  # all 32: rank decides
    assert hosts_of(placement) == ["exact"]
    assert (nodes[2].cpu_free_milli, nodes[2].memory_free_mib) == (0, 0)
    assert hosts_of(place_on(request, nodes, Pack())) == ["undeclared"]
    assert (nodes[3].cpu_free_milli, nodes[3].memory_free_mib) == (None, None)
    assert place_on(request, nodes, Pack()) is None


def test_cpu_only_request_needs_no_gpu() -> None:
    n = node("n", 0, gpus(0, pool="physical"), cpu=1000)
    placement = place_on(Request(cpu_milli=1000), [n], BestFit())
    assert placement is not None and placement.replicas[0].slices == ()
    assert n.cpu_free_milli == 0
    assert place_on(Request(cpu_milli=1), [n], BestFit()) is None


# --- gangs -------------------------------------------------------------------------------


def gang_cluster() -> list[NodeView]:
    return [
        node("a", 0, gpus(1000, 1000), cpu=8000),
        node("b", 1, gpus(1000, 1000), cpu=8000),
        node("c", 2, gpus(1000, 400), cpu=8000, lends=True),
    ]


@pytest.mark.parametrize("policy", POLICIES, ids=POLICY_IDS)
def test_a_gang_that_fits_is_placed_whole(policy: BestFit) -> None:
    nodes = gang_cluster()
    placement = place_on(
        Request(gpus=2, cpu_milli=1000, replicas=2), nodes, policy, ctx_for(policy)
    )
    assert placement is not None
    assert sorted(hosts_of(placement) or []) == ["a", "b"]
    assert sum(g.milli_free for n in nodes for g in n.gpus) == 1400


@pytest.mark.parametrize("policy", POLICIES, ids=POLICY_IDS)
@pytest.mark.parametrize(
    "request_",
    [
        Request(gpus=2, replicas=3),  # two replicas fit, the third does not
        Request(gpus=1, cpu_milli=5000, replicas=4),  # CPU runs out on the fourth
        Request(gpus=1, gpu_milli=600, replicas=6),  # five 600 slices fit, not six
        Request(gpus=2, gpu_milli=500, locality="local-first", replicas=6),  # remote too
    ],
    ids=["whole", "cpu", "fraction", "remote"],
)
def test_a_gang_that_does_not_fit_leaves_every_view_unchanged(
    policy: BestFit, request_: Request
) -> None:
    nodes = gang_cluster()
    index = NodeIndex(nodes)
    before = snapshot(nodes)
    keys_before = {n.name: n.state_key() for n in nodes}
    context = ctx_for(policy)
    assert place(request_, index, policy, context) is None
    assert snapshot(nodes) == before
    assert {n.name: n.state_key() for n in nodes} == keys_before
    assert index.nodes == {n.name: n for n in nodes}  # the caller's views, restored in place
    # the index still places as a fresh one would
    fresh = NodeIndex(copy_nodes(nodes))
    smaller = Request(
        gpus=request_.gpus,
        gpu_milli=request_.gpu_milli,
        cpu_milli=request_.cpu_milli,
        locality=request_.locality,
        replicas=1,
    )
    assert layout(place(smaller, index, policy, context)) == layout(
        place(smaller, fresh, policy, context)
    )


# --- remote vGPU -------------------------------------------------------------------------


def remote_cluster() -> list[NodeView]:
    """No node has four free vGPUs; lenders hold 1, 3 and 2 serving GPUs."""
    return [
        node("host", 0, gpus(1000, 1000), cpu=8000),
        node("lend1", 1, gpus(1000, 0), cpu=0, lends=True),
        node("lend3", 2, gpus(1000, 1000, 1000), cpu=0, lends=True),
        node("lend2", 3, gpus(1000, 1000), cpu=0, lends=True),
        node("private", 4, gpus(1000, 1000, 1000), cpu=0),
    ]


FOUR_HALVES = Request(gpus=4, gpu_milli=500, cpu_milli=1000)


def test_local_only_refuses_what_no_single_host_can_serve() -> None:
    nodes = remote_cluster()
    before = snapshot(nodes)
    assert place_on(FOUR_HALVES, nodes, BestFit()) is None
    assert snapshot(nodes) == before


@pytest.mark.parametrize("locality", ["local-first", "any"])
def test_remote_takes_local_slices_then_the_fewest_lender_nodes(locality: str) -> None:
    nodes = remote_cluster()
    request = Request(gpus=4, gpu_milli=500, cpu_milli=1000, locality=locality)  # type: ignore[arg-type]
    placement = place_on(request, nodes, BestFit())
    assert placement is not None
    (replica,) = placement.replicas
    assert replica.host == "host"  # the only node with CPU for the replica
    assert [(s.node, s.index) for s in replica.slices] == [
        ("host", 0),
        ("host", 1),
        ("lend3", 0),
        ("lend3", 1),
    ]
    assert {s.node for s in replica.remote} == {"lend3"}
    assert nodes[0].cpu_free_milli == 7000
    assert [g.milli_free for g in nodes[2].gpus] == [500, 500, 1000]
    assert all(g.milli_free == 1000 for g in nodes[4].gpus)  # a non-lender lends nothing


def test_remote_spans_several_lenders_only_when_needed() -> None:
    nodes = remote_cluster()
    request = Request(gpus=7, gpu_milli=500, cpu_milli=1000, locality="local-first")
    placement = place_on(request, nodes, BestFit())
    assert placement is not None
    remote = placement.replicas[0].remote
    assert [s.node for s in remote] == ["lend3", "lend3", "lend3", "lend2", "lend2"]
    request = Request(gpus=9, gpu_milli=500, cpu_milli=1000, locality="local-first")
    assert place_on(request, remote_cluster(), BestFit()) is None  # 2 + 6 lendable < 9


def test_remote_is_not_used_when_a_single_host_can_serve() -> None:
    nodes = remote_cluster()
    nodes[4].cpu_free_milli = 8000
    placement = place_on(
        Request(gpus=3, gpu_milli=500, cpu_milli=1000, locality="any"), nodes, BestFit()
    )
    assert placement is not None and placement.replicas[0].remote == ()


def test_remote_never_applies_to_the_physical_pool_or_cpu_only_requests() -> None:
    nodes = [
        node("host", 0, gpus(1000, pool="physical"), cpu=8000),
        node("lend", 1, gpus(1000, 1000, pool="physical"), lends=True, cpu=0),
    ]
    request = Request(gpus=2, pool="physical", cpu_milli=1, locality="local-first")
    assert place_on(request, nodes, BestFit()) is None
    assert place_on(Request(cpu_milli=9000, locality="any"), nodes, BestFit()) is None


def test_remote_host_is_the_node_with_the_most_local_slices() -> None:
    nodes = [
        node("one", 0, gpus(1000), cpu=8000),
        node("two", 1, gpus(1000, 1000), cpu=8000),
        node("lend", 2, gpus(1000, 1000), cpu=0, lends=True),
    ]
    request = Request(gpus=3, gpu_milli=500, cpu_milli=1000, locality="local-first")
    placement = place_on(request, nodes, BestFit())
    assert placement is not None
    assert placement.replicas[0].host == "two"
    assert [s.node for s in placement.replicas[0].slices] == ["two", "two", "lend"]


def test_remote_never_lends_a_physical_gpu() -> None:
    nodes = [
        node("host", 0, gpus(1000), cpu=8000),
        node("lend", 1, gpus(1000, pool="physical"), cpu=0, lends=True),
    ]
    request = Request(gpus=2, pool="any", cpu_milli=1000, locality="local-first")
    placement = place_on(request, nodes, BestFit())
    # "lend" has nothing but a physical GPU: no slice of it may leave the node
    assert placement is None or all(s.node != "lend" for s in placement.replicas[0].slices)


def test_remote_finds_a_placement_when_the_best_host_is_the_only_lender() -> None:
    nodes = [
        node("lender", 0, gpus(1000), lends=True),
        node("other", 1, gpus(1000)),
    ]
    request = Request(gpus=2, gpu_milli=500, pool="vgpu", locality="local-first")
    # "other" hosting with one local slice and one borrowed from "lender" is valid
    placement = place_on(request, nodes, BestFit())
    assert placement is not None
    assert placement.replicas[0].host == "other"


# --- the node index ----------------------------------------------------------------------


def test_one_index_serves_several_policies_and_workloads() -> None:
    from gpuloom.placement.fragmentation import Shape, Workload
    from gpuloom.placement.policies import FGD, Spread

    def cluster() -> list[NodeView]:
        return [
            node("small", 0, gpus(1000, 1000), cpu=8000),
            node("big", 1, gpus(*[1000] * 8), cpu=64000),
            node("half", 2, gpus(500, 1000), cpu=8000),
        ]

    nodes = cluster()
    index = NodeIndex(nodes)
    whole = Workload(((Shape(0, 1000, 1), 1),))
    fraction = Workload(((Shape(0, 500, 1), 1),))
    request = Request(gpus=1, gpu_milli=500)
    steps: list[tuple[Any, Context, str]] = [
        (BestFit(), Context(), "half"),  # least left over: half -> [0, 1000]
        (Spread(), Context(), "big"),  # most left over: big -> [500, 1000 x 7]
        # against 500-milli tasks a slice that leaves 500 costs nothing, one that leaves
        # 0 neither: Δ = 0 everywhere, so rank decides
        (FGD(), Context(workload=fraction), "small"),  # small -> [500, 1000]
        # against whole-GPU tasks, filling a 500 piece removes a fragment (Δ = -500) and
        # splitting an idle GPU makes one (+500): small (rank 0) fills its piece
        (FGD(), Context(workload=whole), "small"),  # small -> [0, 1000]
        (FGD(), Context(workload=whole), "big"),  # big's 500 piece -> [0, 1000 x 7]
        (BestFit(), Context(), "small"),  # small and half both [0, 1000]: rank
    ]
    for policy, context, expected in steps:
        reference = reference_host(request, copy_nodes(nodes), policy, context)
        assert reference is not None and reference.name == expected, policy.name
        assert hosts_of(place(request, index, policy, context)) == [expected], policy.name

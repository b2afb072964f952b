"""The shortcuts that make placement fast decide exactly as the plain definitions.

- FGD's `best_choice` changes the node's lane sums by the GPUs a choice takes instead of
  building the state after it, and tries one of each alike GPU: it equals the meter of
  every GPU re-sorted after each choice, every GPU tried.
- FGD's Δ memo (keyed on what Δ reads) gives every node its own Δ, whichever node
  filled it.
- A node index that compacts (as a kept index does) places as one that never does.
- `fits_locally`, written out per kind of request, is `host_fits` and enough GPUs that
  `gpu_serves`.
- A heap does not look again at a node that did not fit its shape while the node only
  gave, and does once something on it is freed.

The random clusters and requests are those of test_placement_properties.py.
"""

from __future__ import annotations

from dataclasses import replace as replace_request

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.engine import (
    Context,
    NodeIndex,
    ReplicaPlacement,
    best_host,
    place,
    place_replica,
    release,
)
from gpuloom.placement.fragmentation import Shape, Workload, node_state
from gpuloom.placement.policies import FGD
from gpuloom.placement.resources import (
    GpuView,
    NodeView,
    Request,
    best_fit_gpus,
    fits_locally,
    gpu_serves,
    host_fits,
    serving_gpus,
)

from .cluster import copy_nodes
from .test_placement_properties import MODELS, POLICIES, clusters, requests, workload_of


def reference_after(
    node: NodeView, request: Request, chosen: list[GpuView]
) -> tuple[int | None, tuple[tuple[str, str, int], ...]]:
    """The node's state once `chosen` gave a slice each: every GPU re-sorted from scratch."""
    taken = {g.index for g in chosen}
    cpu = node.cpu_free_milli - request.cpu_milli if node.cpu_free_milli is not None else None
    gpus = sorted(
        (g.model, g.pool, g.milli_free - (request.gpu_milli if g.index in taken else 0))
        for g in node.gpus
    )
    return (cpu, tuple(gpus))


@settings(max_examples=400, deadline=None)
@given(
    gpu_list=st.lists(
        st.tuples(
            st.sampled_from(MODELS),
            st.sampled_from(["physical", "vgpu"]),
            st.sampled_from([1000, 2000]),
            st.sampled_from([MILLI_PER_GPU, 700, 500, 250, 0]),
            st.sampled_from([1.0, 0.5, 0.0]),  # free memory, as a part of the GPU's memory
        ),
        max_size=5,
    ),
    cpu=st.sampled_from([None, 0, 4000]),
    memory=st.sampled_from([None, 0, 32000]),
    labels=st.sampled_from([{}, {"zone": "a"}]),
    runtimes=st.sampled_from([(), ("podman",)]),
    request=requests(),
    selector=st.sampled_from([(), (("zone", "a"),)]),
    container=st.booleans(),
)
@example(  # a fraction whose memory share is exactly the memory left
    gpu_list=[("A", "vgpu", 1000, 500, 0.5)],
    cpu=None,
    memory=None,
    labels={},
    runtimes=(),
    request=Request(gpus=1, gpu_milli=500),
    selector=(),
    container=False,
)
@example(  # an idle whole GPU with less memory than the request names
    gpu_list=[("A", "physical", 1000, MILLI_PER_GPU, 1.0)],
    cpu=None,
    memory=None,
    labels={},
    runtimes=(),
    request=Request(gpus=1, gpu_memory_mib=1500),
    selector=(),
    container=False,
)
@example(  # a GPU with its whole share free but not all its memory is not idle
    gpu_list=[("A", "vgpu", 1000, MILLI_PER_GPU, 0.5)],
    cpu=None,
    memory=None,
    labels={},
    runtimes=(),
    request=Request(gpus=1),
    selector=(),
    container=False,
)
@example(  # an idle GPU of the other pool
    gpu_list=[("A", "vgpu", 1000, MILLI_PER_GPU, 1.0)],
    cpu=None,
    memory=None,
    labels={},
    runtimes=(),
    request=Request(gpus=1, pool="physical"),
    selector=(),
    container=False,
)
def test_fits_locally_is_host_fits_and_enough_serving_gpus(
    gpu_list: list[tuple[str, str, int, int, float]],
    cpu: int | None,
    memory: int | None,
    labels: dict[str, str],
    runtimes: tuple[str, ...],
    request: Request,
    selector: tuple[tuple[str, str], ...],
    container: bool,
) -> None:
    """Free memory drawn apart from free share (a whole GPU with its share free but not
    all its memory is not idle), selectors, images and runtimes."""
    views = [
        GpuView(i, f"g{i}", model, pool, size, free, int(size * part))  # type: ignore[arg-type]
        for i, (model, pool, size, free, part) in enumerate(gpu_list)
    ]
    node = NodeView("n0", 0, views, cpu, memory, labels, runtimes=runtimes)
    request = replace_request(request, node_selector=selector, container=container, within=None)
    serving = sum(1 for gpu in views if gpu_serves(request, gpu))
    assert fits_locally(request, node) == (host_fits(request, node) and serving >= request.gpus)
    # and on a host that has all the request asks of it, the GPUs alone decide
    roomy = NodeView("n1", 1, views, None, None, {"zone": "a"}, runtimes=("podman",))
    assert fits_locally(request, roomy) == (serving >= request.gpus)


def reference_best_choice(
    policy: FGD, node: NodeView, request: Request, context: Context
) -> tuple[int, list[int]]:
    """Every serving GPU tried in index order, the first least Δ kept (no shortcut)."""
    meter = policy.meter(context)
    before = meter.of_state(node_state(node))
    if request.gpus == 0 or not request.fractional:
        chosen = best_fit_gpus(request, node)
        delta = meter.of_state(reference_after(node, request, chosen)) - before
        return delta, [g.index for g in chosen]
    best: tuple[int, list[int]] | None = None
    for gpu in sorted(serving_gpus(request, node), key=lambda g: g.index):
        rest = [g for g in best_fit_gpus(request, node) if g.index != gpu.index]
        chosen = [gpu, *rest[: request.gpus - 1]]
        delta = meter.of_state(reference_after(node, request, chosen)) - before
        if best is None or delta < best[0]:
            best = (delta, [g.index for g in chosen])
    assert best is not None
    return best


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), sequence=st.lists(requests(), min_size=1, max_size=8))
@example(  # the CPU a task takes leaves too little for a typical shape: the CPU class after
    cluster=[NodeView("n0", 0, [GpuView(0, "g0", "A", "vgpu", 1000)], 4000, None)],
    sequence=[Request(cpu_milli=1000), Request(gpus=1, cpu_milli=4000)],
)
def test_fgd_choice_equals_its_definition(cluster: list[NodeView], sequence: list[Request]) -> None:
    """`best_choice` changes lane sums instead of building the state after a choice, and
    tries one of each alike GPU: it must give what re-sorting every GPU after each choice
    and trying every GPU gives (old logs re-made); and the memoised Δ is the node's own,
    whichever node filled the memo."""
    policy = FGD()
    context = Context(workload=workload_of(sequence))
    index = NodeIndex(cluster)
    for request in sequence:
        for node in cluster:
            if not fits_locally(request, node):
                continue
            delta, chosen = policy.best_choice(node, request, context)
            assert (delta, [g.index for g in chosen]) == reference_best_choice(
                policy, node, request, context
            )
            # the memo, filled by every node before this one, gives this node's own Δ
            assert policy.delta(node, request, context) == delta
        place(request, index, policy, context)  # the next request sees a fuller cluster


@settings(max_examples=300, deadline=None)
@given(
    frees=st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from([MILLI_PER_GPU, 700, 500, 250])),
        min_size=1,
        max_size=6,
    ),
    count=st.integers(1, 3),
    milli=st.sampled_from([500, 250, 100]),
    shapes=st.lists(
        st.tuples(
            st.integers(1, 3),
            st.sampled_from([MILLI_PER_GPU, 500, 250]),
            st.sampled_from(["", *MODELS]),
        ),
        max_size=4,
    ),
)
@example(  # the second A GPU, with B's as the other slice, leaves B's 500 whole for B's tasks
    frees=[("A", 500), ("B", 500), ("A", 500)], count=2, milli=250, shapes=[(1, 500, "B")]
)
def test_fgd_fraction_choice_on_mixed_models_equals_its_definition(
    frees: list[tuple[str, int]], count: int, milli: int, shapes: list[tuple[int, int, str]]
) -> None:
    """Fractions of several GPUs on a node of mixed models: the case where alike GPUs do
    not stand for each other (the best-fitting others differ), so none is skipped."""
    gpu_views = [
        GpuView(i, f"g{i}", model, "vgpu", 1000, free, free)
        for i, (model, free) in enumerate(frees)
    ]
    node = NodeView("n0", 0, gpu_views, None, None)
    request = Request(gpus=count, gpu_milli=milli)
    workload = Workload(
        tuple((Shape(0, share, k, frozenset(model)), 1) for k, share, model in shapes)
        or ((Shape(0, 500, 1), 1),)
    )
    if not fits_locally(request, node):
        return
    policy, context = FGD(), Context(workload=workload)
    delta, chosen = policy.best_choice(node, request, context)
    assert (delta, [g.index for g in chosen]) == reference_best_choice(
        policy, node, request, context
    )


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpu_lists=st.lists(
        st.lists(
            st.tuples(st.sampled_from(MODELS), st.sampled_from([MILLI_PER_GPU, 700, 500, 250, 0])),
            min_size=1,
            max_size=4,
        ),
        min_size=1,
        max_size=3,
    ),
    cpus=st.lists(st.sampled_from([None, 0, 1000, 2500, 4000, 9000]), min_size=1, max_size=4),
    sequence=st.lists(requests(), min_size=1, max_size=6),
)
@example(  # equal CPU class before, not after: 4000 and 9000 free, 4000 asked
    gpu_lists=[[("A", MILLI_PER_GPU)]],
    cpus=[4000, 9000],
    sequence=[Request(gpus=1, gpu_milli=500, cpu_milli=4000), Request(cpu_milli=16000)],
)
@example(  # the same GPUs in another order leave other states behind (mixed models)
    gpu_lists=[[("A", 500), ("A", 500), ("B", 500)]],
    cpus=[None],
    sequence=[Request(gpus=2, gpu_milli=250), Request(gpus=1, gpu_milli=500, models=("B",))],
)
@pytest.mark.parametrize("limit", [500_000, 3])
def test_memoised_delta_is_each_nodes_own(
    gpu_lists: list[list[tuple[str, int]]],
    cpus: list[int | None],
    sequence: list[Request],
    limit: int,
) -> None:
    """Nodes that share GPU states (in two orders) but not free CPU, scored by one policy:
    each node's memoised Δ is the Δ a fresh policy computes for that node; also when the
    memo is forgotten every few entries, with the numbers its keys are made of."""
    nodes = []
    for number, (gpu_list, cpu, order) in enumerate(
        (g, c, o) for g in gpu_lists for c in cpus for o in (1, -1)
    ):
        views = [
            GpuView(i, f"n{number}-g{i}", model, "vgpu", 1000, free, free)
            for i, (model, free) in enumerate(gpu_list[::order])
        ]
        nodes.append(NodeView(f"n{number}", number, views, cpu, None))
    context = Context(workload=workload_of(sequence))
    policy = FGD(cache_limit=limit)
    for request in sequence:
        plain = replace_request(request, replicas=1, locality="local-only")
        for node in nodes:
            if fits_locally(plain, node):
                own = FGD().best_choice(node, plain, context)[0]
                assert policy.delta(node, plain, context) == own, node


@pytest.mark.parametrize("name", ["bestfit", "fgd"])
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=clusters(),
    shapes=st.lists(requests(), min_size=1, max_size=3),
    picks=st.lists(st.integers(0, 2), min_size=1, max_size=12),
)
def test_a_compacted_index_decides_as_one_never_compacted(
    name: str, cluster: list[NodeView], shapes: list[Request], picks: list[int]
) -> None:
    """`NodeIndex.compact` (what a kept index does now and then) drops stale heap entries
    and heaps far behind, and a full table of node states is forgotten; the placements
    stay those of an index that does neither.
    A few request shapes recur, so kept heaps are asked again after compacting."""
    sequence = [shapes[pick % len(shapes)] for pick in picks]
    context = Context(workload=workload_of(sequence))
    # it also forgets its node states at every second new one (`groups_limit`)
    compacted = NodeIndex(copy_nodes(cluster), groups_limit=2)
    plain = NodeIndex(copy_nodes(cluster))
    policy_a, policy_b = POLICIES[name](), POLICIES[name]()
    for request in sequence:
        assert place(request, compacted, policy_a, context) == place(
            request, plain, policy_b, context
        )
        compacted.compact()
        assert compacted.backlog == 0


def test_a_node_that_did_not_fit_is_looked_at_again_once_something_on_it_is_freed() -> None:
    """n0's one GPU is taken, so a second one-GPU request goes to n1 and the heap of
    its shape files n0 as not fitting. Taking from n1 does not bring n0 back; giving
    n0's GPU back does."""
    nodes = [
        NodeView(f"n{i}", i, [GpuView(0, f"n{i}-g0", "A", "physical", 1000)], None, None)
        for i in range(2)
    ]
    index, policy, context = NodeIndex(nodes), POLICIES["bestfit"](), Context()
    whole, other = Request(gpus=1), Request(gpus=1, cpu_milli=0, memory_mib=1)
    first = place_replica(whole, index, policy, context)
    assert first is not None and first.host == "n0"
    second = place_replica(other, index, policy, context)  # other's heap: n0 does not fit
    assert second is not None and second.host == "n1"
    assert place_replica(other, index, policy, context) is None  # n1 only took
    release(index, first)
    again = place_replica(other, index, policy, context)
    assert again is not None and again.host == "n0"


@pytest.mark.parametrize("name", ["bestfit", "fgd"])
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=clusters(),
    shapes=st.lists(requests(), min_size=1, max_size=3),
    steps=st.lists(st.tuples(st.booleans(), st.integers(0, 5)), min_size=1, max_size=16),
)
def test_a_kept_heap_finds_the_best_host_as_scoring_every_node_does(
    name: str, cluster: list[NodeView], shapes: list[Request], steps: list[tuple[bool, int]]
) -> None:
    """Replicas placed and given back in any order, a few shapes recurring: at every
    step the index's best host is the best of all nodes that fit, scored afresh."""
    shapes = [replace_request(r, replicas=1, locality="local-only") for r in shapes]
    context = Context(workload=workload_of(shapes))
    index = NodeIndex(copy_nodes(cluster))
    policy, fresh = POLICIES[name](), POLICIES[name]()
    held: list[ReplicaPlacement] = []
    for placing, pick in steps:
        if not placing and held:
            release(index, held.pop(pick % len(held)))
            continue
        request = shapes[pick % len(shapes)]
        hosts = [n for n in index.nodes.values() if fits_locally(request, n)]
        expected = best_host(request, hosts, fresh, context)
        found = index.best_local(request, policy, context)
        assert (found and found.name) == (expected and expected.name)
        replica = place_replica(request, index, policy, context)
        if replica is not None:
            held.append(replica)

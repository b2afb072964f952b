"""Random clusters (a few nodes, mixed pools and models, some lenders, repeated node states)
and random request sequences, placed one after another with every policy through
`NodeIndex` + `place`.

After every request:
- no GPU's milli_free or memory_free_mib, nor a node's CPU or memory, goes below 0;
- every slice respects the request's model, pool and locality rules, and what the views
  lost is exactly what the placement's slices and replicas say; a refused request (a
  failed gang too) changes nothing;
- grouping is exact: the decision equals the one made by scoring every node individually
  (a reference chooser for local-only requests, the engine with grouping off otherwise),
  and nodes in one state get one score;
- the same sequence placed twice gives the same placements.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import replace as replace_request
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from gpuloom.placement.engine import Context, NodeIndex, place
from gpuloom.placement.fragmentation import Shape, Workload
from gpuloom.placement.policies import FGD, BestFit, DotProd, Loom, Pack, Random, Spread
from gpuloom.placement.resources import (
    WHOLE,
    GpuView,
    NodeView,
    Placement,
    Request,
    fits_locally,
)

from .cluster import (
    Snapshot,
    Ungrouped,
    copy_nodes,
    layout,
    reference_place_local,
    snapshot,
)

POLICIES: dict[str, Callable[[], Any]] = {
    "bestfit": BestFit,
    "spread": Spread,
    "dotprod": DotProd,
    "pack": Pack,
    "random": Random,
    "fgd": FGD,
    "loom": Loom,
}

MODELS = ("A", "B")

# --- strategies --------------------------------------------------------------------------

gpu_spec = st.one_of(
    st.tuples(st.sampled_from(MODELS), st.just("physical"), st.sampled_from([1000, 2000]),
              st.sampled_from([WHOLE, WHOLE, 0])),
    st.tuples(st.sampled_from(MODELS), st.just("vgpu"), st.sampled_from([1000, 2000]),
              st.sampled_from([WHOLE, WHOLE, 700, 500, 250, 0])),
    st.tuples(st.just("A"), st.just("vgpu"), st.just(1000), st.sampled_from([WHOLE, 500])),
)  # fmt: skip

template = st.fixed_dictionaries(
    {
        "gpus": st.lists(gpu_spec, max_size=4),
        "cpu": st.sampled_from([None, 0, 2000, 8000, 32000]),
        "memory": st.sampled_from([None, 4000, 64000]),
        "labels": st.sampled_from([(), (), (("zone", "a"),), (("zone", "b"),)]),
        "lends": st.booleans(),
        "runtimes": st.sampled_from([(), ("podman",)]),
    }
)


@st.composite
def clusters(
    draw: st.DrawFn, template: st.SearchStrategy[dict[str, Any]] = template
) -> list[NodeView]:
    """2-7 nodes built from 1-3 templates, so that several nodes share a state."""
    templates = draw(st.lists(template, min_size=1, max_size=3))
    choices = draw(st.lists(st.integers(0, len(templates) - 1), min_size=2, max_size=7))
    ranks = draw(st.permutations(range(len(choices))))
    nodes = []
    for number, (choice, rank) in enumerate(zip(choices, ranks, strict=True)):
        spec = templates[choice]
        gpu_views = [
            GpuView(i, f"n{number}-g{i}", model, pool, memory, free, memory * free // WHOLE)
            for i, (model, pool, memory, free) in enumerate(spec["gpus"])
        ]
        nodes.append(
            NodeView(
                f"n{number}",
                rank,
                gpu_views,
                spec["cpu"],
                spec["memory"],
                dict(spec["labels"]),
                spec["lends"],
                tuple(spec.get("runtimes", ())),
            )
        )
    return nodes


@st.composite
def requests(draw: st.DrawFn) -> Request:
    count = draw(st.sampled_from([0, 1, 1, 2, 2, 3]))
    milli = draw(st.sampled_from([WHOLE, WHOLE, 700, 500, 300, 250, 100]))
    pool = draw(st.sampled_from(["physical", "vgpu", "any", "any"]))
    locality = draw(st.sampled_from(["local-only", "local-only", "local-first", "any"]))
    return Request(
        gpus=count,
        gpu_milli=milli,
        gpu_memory_mib=draw(st.sampled_from([None, None, 100, 600, 1500])),
        cpu_milli=draw(st.sampled_from([0, 0, 1000, 4000, 16000])),
        memory_mib=draw(st.sampled_from([0, 0, 2000, 32000])),
        models=draw(st.sampled_from([(), (), (), ("A",), ("B",), ("A", "B")])),
        pool=pool,  # type: ignore[arg-type]
        locality=locality,  # type: ignore[arg-type]
        node_selector=draw(st.sampled_from([(), (), (), (("zone", "a"),)])),
        replicas=draw(st.sampled_from([1, 1, 1, 2, 3])),
        container=draw(st.sampled_from([False, False, True])),
    )


small_template = st.fixed_dictionaries(
    {
        "gpus": st.lists(
            st.tuples(st.sampled_from(MODELS), st.sampled_from(["vgpu", "vgpu", "physical"]),
                      st.just(1000), st.sampled_from([WHOLE, WHOLE, 700, 500, 0])),
            max_size=2,
        ),
        "cpu": st.sampled_from([None, 0, 8000]),
        "memory": st.just(None),
        "labels": st.just(()),
        "lends": st.sampled_from([True, True, False]),
    }
)  # fmt: skip


@st.composite
def remote_requests(draw: st.DrawFn) -> Request:
    """Requests too big for one small node, so that remote vGPU is used."""
    milli = draw(st.sampled_from([WHOLE, 700, 500, 300]))
    return Request(
        gpus=draw(st.integers(2, 4)),
        gpu_milli=milli,
        cpu_milli=draw(st.sampled_from([0, 1000])),
        models=draw(st.sampled_from([(), (), ("A",)])),
        pool=draw(st.sampled_from(["vgpu", "any"] if milli < WHOLE else ["vgpu"])),
        locality=draw(st.sampled_from(["local-first", "any", "local-only"])),
        replicas=draw(st.sampled_from([1, 1, 2])),
    )


def workload_of(sequence: list[Request]) -> Workload:
    return Workload.typical(
        [Shape.of(r) for r in sequence] + [Shape(0, 1000, 1), Shape(0, 500, 1), Shape(0, 0, 0)]
    )


# --- checks ------------------------------------------------------------------------------


def check_bounds(nodes: list[NodeView]) -> None:
    for n in nodes:
        assert n.cpu_free_milli is None or n.cpu_free_milli >= 0, n
        assert n.memory_free_mib is None or n.memory_free_mib >= 0, n
        for g in n.gpus:
            assert 0 <= g.milli_free <= WHOLE, (n.name, g)
            assert 0 <= g.memory_free_mib <= g.memory_mib, (n.name, g)


def check_placement(
    request: Request,
    placement: Placement | None,
    before: Snapshot,
    nodes: list[NodeView],
    local_hosts: set[str],
) -> None:
    """Model, pool and locality of every slice; what the views lost is what was given."""
    check_bounds(nodes)
    after = snapshot(nodes)
    if placement is None:
        assert after == before
        return
    assert len(placement.replicas) == request.replicas
    gpu_before = {
        (name, g[0]): GpuView(g[0], g[1], g[2], g[3], g[4], g[5], g[6])
        for name, view in before.items()
        for g in view[5]
    }
    lends = {name: view[4] for name, view in before.items()}
    used: Counter[tuple[str, int]] = Counter()
    used_memory: Counter[tuple[str, int]] = Counter()
    cpu: Counter[str] = Counter()
    memory: Counter[str] = Counter()
    for replica in placement.replicas:
        host_labels = dict(before[replica.host][3])
        assert all(host_labels.get(k) == v for k, v in request.node_selector)
        assert before[replica.host][6] or not request.container  # an image needs a runtime
        assert (replica.cpu_milli, replica.memory_mib) == (request.cpu_milli, request.memory_mib)
        cpu[replica.host] += replica.cpu_milli
        memory[replica.host] += replica.memory_mib
        assert len(replica.slices) == request.gpus
        assert len({(s.node, s.index) for s in replica.slices}) == request.gpus
        for s in replica.slices:
            g = gpu_before[(s.node, s.index)]
            assert s.uuid == g.uuid
            assert s.milli == request.gpu_milli
            assert s.memory_mib == request.memory_for(g)
            if request.models:
                assert g.model in request.models
            if request.pool != "any":
                assert g.pool == request.pool
            if request.fractional:
                assert g.pool == "vgpu"
            else:
                assert g.idle and s.memory_mib == g.memory_mib  # whole: an idle GPU, all of it
            if g.pool == "physical":
                assert s.node == replica.host  # physical GPUs are always local
            if s.node != replica.host:
                assert request.locality != "local-only"
                assert lends[s.node] and g.pool == "vgpu"
            used[(s.node, s.index)] += s.milli
            used_memory[(s.node, s.index)] += s.memory_mib
        if request.replicas == 1:
            # remote only when no single host could serve the replica
            assert bool(replica.remote) == (not local_hosts)
            if not replica.remote:
                assert replica.host in local_hosts
    for n in nodes:
        view = before[n.name]
        if view[1] is not None:
            assert view[1] - n.cpu_free_milli == cpu[n.name]
        if view[2] is not None:
            assert view[2] - n.memory_free_mib == memory[n.name]
        for g, old in zip(sorted(n.gpus, key=lambda g: g.index), view[5], strict=True):
            assert old[5] - g.milli_free == used[(n.name, g.index)]
            assert old[6] - g.memory_free_mib == used_memory[(n.name, g.index)]


def check_equal_states_score_equal(
    policy: Any, request: Request, nodes: list[NodeView], context: Context
) -> None:
    if not policy.grouped:
        return
    scores: dict[tuple[object, ...], int] = {}
    for n in nodes:
        if fits_locally(request, n):
            score = policy.score(n, request, context)
            assert scores.setdefault(n.state_key(), score) == score, n.name


# --- the runs ----------------------------------------------------------------------------

FRAGMENTATION_AWARE = {"fgd", "loom"}


def outcome(request: Request, placement: Placement | None, grouped: bool) -> str:
    """A label for Hypothesis' statistics: what kinds of decisions the runs cover."""
    if placement is None:
        kind = "refused gang" if request.replicas > 1 else "refused"
    elif any(r.remote for r in placement.replicas):
        kind = "remote"
    else:
        kind = "gang" if request.replicas > 1 else "placed"
    return f"{kind}{' (nodes share states)' if grouped else ''}"


def run_checked(
    name: str, cluster: list[NodeView], sequence: list[Request], seed: int
) -> list[object]:
    policy = POLICIES[name]()
    workload = workload_of(sequence)
    nodes = copy_nodes(cluster)
    index = NodeIndex(nodes)
    reference = copy_nodes(cluster)
    decisions: list[object] = []
    for position, request in enumerate(sequence):
        context = Context(seed, position, workload)
        fresh = POLICIES[name]()  # the reference shares no cache with the engine's policy
        before = snapshot(nodes)
        local_hosts = {n.name for n in nodes if fits_locally(request, n)}
        check_equal_states_score_equal(policy, request, nodes, context)
        if request.locality == "local-only":
            expected = reference_place_local(request, reference, fresh, context)
        else:
            expected = place(request, NodeIndex(reference), Ungrouped(fresh), context)
        placement = place(request, index, policy, context)
        assert layout(placement) == layout(expected), (position, request)
        check_placement(request, placement, before, nodes, local_hosts)
        assert snapshot(nodes) == snapshot(reference)
        decisions.append(layout(placement))
        shared = len({n.state_key() for n in nodes}) < len(nodes)
        event(outcome(request, placement, shared))
    return decisions


def run_plain(
    name: str, cluster: list[NodeView], sequence: list[Request], seed: int
) -> list[object]:
    policy = POLICIES[name]()
    workload = workload_of(sequence)
    nodes = copy_nodes(cluster)
    index = NodeIndex(nodes)
    decisions: list[object] = []
    for position, request in enumerate(sequence):
        context = Context(seed, position, workload)
        decisions.append(layout(place(request, index, policy, context)))
    return decisions


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=clusters(),
    sequence=st.lists(requests(), min_size=1, max_size=10),
    seed=st.integers(0, 2**32),
)
def test_random_sequences_keep_every_rule_and_grouping_is_exact(
    name: str, cluster: list[NodeView], sequence: list[Request], seed: int
) -> None:
    sequence = sequence
    original = snapshot(cluster)
    decisions = run_checked(name, cluster, sequence, seed)
    assert snapshot(cluster) == original  # the runs worked on copies
    assert run_plain(name, cluster, sequence, seed) == decisions  # deterministic


@pytest.mark.parametrize("name", ["bestfit", "fgd", "loom"])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cluster=clusters(), request=requests())
def test_repeated_requests_fill_the_cluster_without_overcommit(
    name: str, cluster: list[NodeView], request: Request
) -> None:
    """The same request again and again until it no longer fits: the views end up full."""
    run_checked(name, cluster, [request] * 12, seed=0)


@pytest.mark.parametrize("name", list(POLICIES))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster=clusters(small_template),
    sequence=st.lists(remote_requests(), min_size=1, max_size=6),
    seed=st.integers(0, 2**32),
)
def test_remote_vgpu_sequences_keep_every_rule(
    name: str, cluster: list[NodeView], sequence: list[Request], seed: int
) -> None:
    """Small nodes, many lenders, multi-GPU requests: the remote path under the same checks."""
    sequence = sequence
    decisions = run_checked(name, cluster, sequence, seed)
    assert run_plain(name, cluster, sequence, seed) == decisions


# --- FGD's choice of GPUs: the fast path equals the definition -----------------------------


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


def reference_best_choice(
    policy: FGD, node: NodeView, request: Request, context: Context
) -> tuple[int, list[int]]:
    """Every serving GPU tried in index order, the first least Δ kept (no shortcut)."""
    from gpuloom.placement.fragmentation import node_state
    from gpuloom.placement.resources import best_fit_gpus, serving_gpus

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
def test_fgd_choice_equals_its_definition(cluster: list[NodeView], sequence: list[Request]) -> None:
    """`after` edits the sorted state and `best_choice` tries one of each alike GPU; both
    must give what re-sorting every GPU and trying every GPU gives (old logs re-made);
    and the memoised Δ is the node's own, whichever node filled the memo."""
    policy = FGD()
    context = Context(workload=workload_of(sequence))
    index = NodeIndex(cluster)
    for request in sequence:
        for node in cluster:
            if not fits_locally(request, node):
                continue
            delta, chosen = policy.best_choice(node, request, context)
            assert policy.after(node, request, chosen) == reference_after(node, request, chosen)
            assert (delta, [g.index for g in chosen]) == reference_best_choice(
                policy, node, request, context
            )
            # the memo, filled by every node before this one, gives this node's own Δ
            assert policy.delta(node, request, context) == delta
        place(request, index, policy, context)  # the next request sees a fuller cluster


@settings(max_examples=300, deadline=None)
@given(
    frees=st.lists(
        st.tuples(st.sampled_from(MODELS), st.sampled_from([WHOLE, 700, 500, 250])),
        min_size=1,
        max_size=6,
    ),
    count=st.integers(1, 3),
    milli=st.sampled_from([500, 250, 100]),
    shapes=st.lists(
        st.tuples(
            st.integers(1, 3), st.sampled_from([WHOLE, 500, 250]), st.sampled_from(["", *MODELS])
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
            st.tuples(st.sampled_from(MODELS), st.sampled_from([WHOLE, 700, 500, 250, 0])),
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
    gpu_lists=[[("A", WHOLE)]],
    cpus=[4000, 9000],
    sequence=[Request(gpus=1, gpu_milli=500, cpu_milli=4000), Request(cpu_milli=16000)],
)
@example(  # the same GPUs in another order leave other states behind (mixed models)
    gpu_lists=[[("A", 500), ("A", 500), ("B", 500)]],
    cpus=[None],
    sequence=[Request(gpus=2, gpu_milli=250), Request(gpus=1, gpu_milli=500, models=("B",))],
)
def test_memoised_delta_is_each_nodes_own(
    gpu_lists: list[list[tuple[str, int]]], cpus: list[int | None], sequence: list[Request]
) -> None:
    """Nodes that share GPU states (in two orders) but not free CPU, scored by one policy:
    each node's memoised Δ is the Δ a fresh policy computes for that node."""
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
    policy = FGD()
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
    and heaps far behind; the placements stay those of an index that never compacts.
    A few request shapes recur, so kept heaps are asked again after compacting."""
    sequence = [shapes[pick % len(shapes)] for pick in picks]
    context = Context(workload=workload_of(sequence))
    compacted, plain = NodeIndex(copy_nodes(cluster)), NodeIndex(copy_nodes(cluster))
    policy_a, policy_b = POLICIES[name](), POLICIES[name]()
    for request in sequence:
        assert place(request, compacted, policy_a, context) == place(
            request, plain, policy_b, context
        )
        compacted.compact()
        assert compacted.backlog == 0

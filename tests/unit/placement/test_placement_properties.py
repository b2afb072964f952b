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
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.engine import Context, NodeIndex, place
from gpuloom.placement.fragmentation import Shape, Workload
from gpuloom.placement.policies import FGD, BestFit, DotProd, Loom, Pack, Random, Spread
from gpuloom.placement.resources import GpuView, NodeView, Placement, Request, fits_locally

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
              st.sampled_from([MILLI_PER_GPU, MILLI_PER_GPU, 0])),
    st.tuples(st.sampled_from(MODELS), st.just("vgpu"), st.sampled_from([1000, 2000]),
              st.sampled_from([MILLI_PER_GPU, MILLI_PER_GPU, 700, 500, 250, 0])),
    st.tuples(st.just("A"), st.just("vgpu"), st.just(1000), st.sampled_from([MILLI_PER_GPU, 500])),
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
            GpuView(i, f"n{number}-g{i}", model, pool, memory, free, memory * free // MILLI_PER_GPU)
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
                {"rack": f"r{number % 2}"},  # two racks: heaps of a shape kept within one
            )
        )
    return nodes


@st.composite
def requests(draw: st.DrawFn) -> Request:
    count = draw(st.sampled_from([0, 1, 1, 2, 2, 3]))
    milli = draw(st.sampled_from([MILLI_PER_GPU, MILLI_PER_GPU, 700, 500, 300, 250, 100]))
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
        within=draw(st.sampled_from([None, None, None, ("rack", "r0"), ("rack", "r1")])),
    )


small_template = st.fixed_dictionaries(
    {
        "gpus": st.lists(
            st.tuples(st.sampled_from(MODELS), st.sampled_from(["vgpu", "vgpu", "physical"]),
                      st.just(1000), st.sampled_from([MILLI_PER_GPU, MILLI_PER_GPU, 700, 500, 0])),
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
    milli = draw(st.sampled_from([MILLI_PER_GPU, 700, 500, 300]))
    return Request(
        gpus=draw(st.integers(2, 4)),
        gpu_milli=milli,
        cpu_milli=draw(st.sampled_from([0, 1000])),
        models=draw(st.sampled_from([(), (), ("A",)])),
        pool=draw(st.sampled_from(["vgpu", "any"] if milli < MILLI_PER_GPU else ["vgpu"])),
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
            assert 0 <= g.milli_free <= MILLI_PER_GPU, (n.name, g)
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

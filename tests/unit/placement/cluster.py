"""Small builders for hand-made nodes, value snapshots, and a reference placer that scores
every node individually (no `NodeIndex` grouping) for the grouping-exactness checks."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping
from typing import Any

from gpuloom.placement.engine import Context, NodeIndex, Policy, place
from gpuloom.placement.resources import (
    GpuView,
    NodeView,
    Placement,
    Pool,
    ReplicaPlacement,
    Request,
    fits_locally,
    take,
    take_host,
)


def gpu(
    index: int,
    pool: Pool = "vgpu",
    *,
    model: str = "A",
    memory: int = 1000,
    free: int = 1000,
    memory_free: int | None = None,
) -> GpuView:
    """A GPU; a partly used one gets the same share of its memory as of its compute."""
    if memory_free is None:
        memory_free = memory * free // 1000
    return GpuView(index, f"{model}-{index}", model, pool, memory, free, memory_free)


def gpus(*free: int, pool: Pool = "vgpu", model: str = "A", memory: int = 1000) -> list[GpuView]:
    return [gpu(i, pool, model=model, memory=memory, free=f) for i, f in enumerate(free)]


def node(
    name: str,
    rank: int,
    gpu_list: Iterable[GpuView] = (),
    *,
    cpu: int | None = None,
    memory: int | None = None,
    labels: Mapping[str, str] | None = None,
    lends: bool = False,
) -> NodeView:
    return NodeView(name, rank, list(gpu_list), cpu, memory, dict(labels or {}), lends)


Snapshot = dict[str, tuple[Any, ...]]


def snapshot(nodes: Iterable[NodeView]) -> Snapshot:
    """Every value of every view, GPU by GPU in index order."""
    return {
        n.name: (
            n.rank,
            n.cpu_free_milli,
            n.memory_free_mib,
            tuple(sorted(n.labels.items())),
            n.lends_remote_vgpu,
            tuple(
                (g.index, g.uuid, g.model, g.pool, g.memory_mib, g.milli_free, g.memory_free_mib)
                for g in sorted(n.gpus, key=lambda g: g.index)
            ),
            n.runtimes,
        )
        for n in nodes
    }


def copy_nodes(nodes: Iterable[NodeView]) -> list[NodeView]:
    return [copy.deepcopy(n) for n in nodes]


def place_on(
    request: Request, nodes: list[NodeView], policy: Policy, context: Context | None = None
) -> Placement | None:
    """Place through a fresh `NodeIndex` over `nodes` (the views are mutated)."""
    return place(request, NodeIndex(nodes), policy, context or Context())


def hosts_of(placement: Placement | None) -> list[str] | None:
    return None if placement is None else [r.host for r in placement.replicas]


def layout(
    placement: Placement | None,
) -> list[tuple[str, tuple[tuple[str, int, int], ...]]] | None:
    """(host, ((node, gpu index, milli), ...)) per replica: what a placement decided."""
    if placement is None:
        return None
    return [
        (r.host, tuple((s.node, s.index, s.milli) for s in r.slices)) for r in placement.replicas
    ]


# --- the reference: score every node, no grouping --------------------------------------------


def reference_host(
    request: Request, nodes: list[NodeView], policy: Policy, context: Context
) -> NodeView | None:
    """max (normalised score, -rank) over every node that can host `request` locally."""
    feasible = [n for n in nodes if fits_locally(request, n)]
    if not feasible:
        return None
    scores = policy.normalize([policy.score(n, request, context) for n in feasible])
    best = max(range(len(feasible)), key=lambda i: (scores[i], -feasible[i].rank))
    return feasible[best]


def reference_place_local(
    request: Request, nodes: list[NodeView], policy: Policy, context: Context
) -> Placement | None:
    """Local-only placement of a gang without `NodeIndex`. On success the views in `nodes`
    are replaced by changed copies (so no memo on the old views can go stale)."""
    work = copy_nodes(nodes)
    replicas = []
    for _ in range(request.replicas):
        host = reference_host(request, work, policy, context)
        if host is None:
            return None
        slices = tuple(take(host, g, request) for g in policy.pick(host, request, context))
        take_host(host, request)
        replicas.append(ReplicaPlacement(host.name, slices, request.cpu_milli, request.memory_mib))
    nodes[:] = work
    return Placement(tuple(replicas))


class Ungrouped:
    """`policy` with grouping switched off: the engine then scores every node."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.version = inner.version
        self.grouped = False
        self.needs_workload = inner.needs_workload

    @property
    def params(self) -> Mapping[str, Any]:
        return self.inner.params  # type: ignore[no-any-return]

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        return self.inner.score(node, request, context)  # type: ignore[no-any-return]

    def normalize(self, scores: list[int]) -> list[int]:
        return self.inner.normalize(scores)  # type: ignore[no-any-return]

    def pick(self, node: NodeView, request: Request, context: Context) -> list[GpuView]:
        return self.inner.pick(node, request, context)  # type: ignore[no-any-return]

"""GPU fragmentation measured against a typical workload (FGD, Weng et al., ATC'23).

Free GPU capacity is a fragment when the tasks that typically arrive could not
use it. `Workload` is that distribution: task shapes with integer weights. The
fragmentation of a node is the weighted sum over shapes of the free milli-GPU
that shape could not use (see `../shared/traces/alibaba-gpu-v2023/EVALUATION.md`
§4); it is kept as an integer numerator (milli-GPU x weight) so that comparing
two nodes never depends on floating point.

The definition is generalised to nodes with mixed GPU models and pools: a GPU
is usable by a shape when its model is allowed and its pool can serve the
shape; on a single-model node that is exactly the paper's definition.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from gpuloom.placement.resources import WHOLE, NodeView, Request


@dataclass(frozen=True, slots=True)
class Shape:
    """One kind of task: CPU, per-GPU share, GPU count, allowed models (empty: any)."""

    cpu_milli: int
    gpu_milli: int
    gpus: int
    models: frozenset[str] = frozenset()

    @classmethod
    def of(cls, request: Request) -> Shape:
        milli = request.gpu_milli if request.gpus else 0
        return cls(request.cpu_milli, milli, request.gpus, frozenset(request.models))


@dataclass(frozen=True, slots=True)
class Workload:
    """Shapes with integer weights; `total` is the sum of the weights.

    `scarce`: the GPU models its model-bound shapes would mostly take, on the cluster
    it was read for (`gpuloom.placement.scarcity`); loom v3 reads it, FGD does not.
    """

    shapes: tuple[tuple[Shape, int], ...]
    scarce: frozenset[str] = frozenset()

    @property
    def total(self) -> int:
        return sum(weight for _, weight in self.shapes)

    @classmethod
    def typical(cls, shapes: Iterable[Shape], coverage_percent: int = 95) -> Workload:
        """The most frequent shapes that cover `coverage_percent` of the tasks.

        Ties in frequency are ordered by the shape's fields, so the result does not
        depend on the order the tasks came in.
        """
        counts = Counter(shapes)
        ordered = sorted(
            counts.items(),
            key=lambda item: (
                -item[1],
                item[0].cpu_milli,
                item[0].gpu_milli,
                item[0].gpus,
                sorted(item[0].models),
            ),
        )
        everyone = sum(counts.values())
        kept: list[tuple[Shape, int]] = []
        covered = 0
        for shape, count in ordered:
            if everyone and covered * 100 >= coverage_percent * everyone:
                break
            kept.append((shape, count))
            covered += count
        return cls(tuple(kept))


GpuState = tuple[str, str, int]  # (model, pool, milli_free)
NodeState = tuple[int | None, tuple[GpuState, ...]]


def node_state(node: NodeView) -> NodeState:
    """What fragmentation depends on: free CPU and the multiset of (model, pool, free)."""
    cached = node.cached_state
    if cached is None:
        cached = (
            node.cpu_free_milli,
            tuple(sorted((g.model, g.pool, g.milli_free) for g in node.gpus)),
        )
        node.cached_state = cached
    return cached  # type: ignore[return-value]


def _usable(shape: Shape, model: str, pool: str) -> bool:
    if shape.models and model not in shape.models:
        return False
    return pool == "vgpu" or shape.gpu_milli >= WHOLE


def shape_fragment(shape: Shape, cpu_free: int | None, gpus: tuple[GpuState, ...]) -> int:
    """Free milli-GPU of the node that `shape` could not use: all of it when the shape
    cannot run there (no GPU asked, too little CPU, too few GPUs it may use with room
    for its share), else what the GPUs it cannot use hold. One pass over the GPUs."""
    idle = unusable = fitting = 0
    need = shape.gpu_milli
    for model, pool, free in gpus:
        idle += free
        if free >= need and _usable(shape, model, pool):
            fitting += 1
        else:
            unusable += free
    if shape.gpus == 0 or fitting < shape.gpus:
        return idle  # a CPU-only task uses no GPU: all of it is a fragment to it
    if cpu_free is not None and cpu_free < shape.cpu_milli:
        return idle
    return unusable


class FragmentationMeter:
    """F_n (numerator: milli-GPU x weight) of node states, memoised.

    A node's CPU only decides, per shape, whether that shape could run there at
    all (case 3 of §4). So for each distinct GPU state the meter keeps the
    shapes sorted by CPU request with prefix sums, and F_n for any free CPU is
    one binary search: GPU states are few even when free CPU is all different.
    """

    def __init__(self, workload: Workload, cache_limit: int = 200_000) -> None:
        self.workload = workload
        self.total = workload.total or 1
        self._cache: dict[NodeState, int] = {}
        self._tables: dict[tuple[GpuState, ...], _GpuTable] = {}
        self._limit = cache_limit
        self._cpu_only_weight = sum(w for shape, w in workload.shapes if shape.gpus == 0)
        gpu_shapes = sorted(
            ((shape, w) for shape, w in workload.shapes if shape.gpus > 0),
            key=lambda item: item[0].cpu_milli,
        )
        self._gpu_shapes = gpu_shapes
        #: What of each shape `shape_fragment` reads without CPU: shapes that differ
        #: only in CPU (most of a workload's) share one fragment per GPU state.
        self._gpu_parts = [(s.gpus, s.gpu_milli, s.models) for s, _ in gpu_shapes]
        self._cpu_thresholds = [shape.cpu_milli for shape, _ in gpu_shapes]
        self._gpu_weight = sum(w for _, w in gpu_shapes)

    def _table(self, gpus: tuple[GpuState, ...]) -> _GpuTable:
        table = self._tables.get(gpus)
        if table is None:
            prefix_fit = [0]
            prefix_weight = [0]
            fragments: dict[tuple[int, int, frozenset[str]], int] = {}
            for (shape, weight), part in zip(self._gpu_shapes, self._gpu_parts, strict=True):
                fragment = fragments.get(part)
                if fragment is None:
                    fragment = fragments[part] = shape_fragment(shape, None, gpus)
                prefix_fit.append(prefix_fit[-1] + weight * fragment)
                prefix_weight.append(prefix_weight[-1] + weight)
            table = _GpuTable(sum(free for _, _, free in gpus), prefix_fit, prefix_weight)
            if len(self._tables) >= self._limit:
                self._tables.clear()
            self._tables[gpus] = table
        return table

    def cpu_class(self, cpu_free: int | None) -> int:
        """How many GPU shapes (by CPU request) `cpu_free` can host: all F_n depends on."""
        if cpu_free is None:
            return len(self._gpu_shapes)
        return bisect.bisect_right(self._cpu_thresholds, cpu_free)

    def of_state(self, state: NodeState) -> int:
        cached = self._cache.get(state)
        if cached is not None:
            return cached
        cpu_free, gpus = state
        table = self._table(gpus)
        fits = self.cpu_class(cpu_free)
        short_weight = self._gpu_weight - table.prefix_weight[fits] + self._cpu_only_weight
        value = table.prefix_fit[fits] + short_weight * table.idle
        if len(self._cache) >= self._limit:
            self._cache.clear()
        self._cache[state] = value
        return value

    def of_node(self, node: NodeView) -> int:
        return self.of_state(node_state(node))

    def milli(self, numerator: int) -> float:
        """The numerator as milli-GPU (for reports, never for decisions)."""
        return numerator / self.total


@dataclass(frozen=True, slots=True)
class _GpuTable:
    idle: int
    prefix_fit: list[int]
    prefix_weight: list[int]

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

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.resources import NodeView, Request


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


def usable(models: frozenset[str], share: int, model: str, pool: str) -> bool:
    """May a shape asking `share` of a GPU of `models` (empty: any) use a GPU of `model` in
    `pool`: its model allowed, and a vGPU, or a physical GPU for a whole-GPU shape. (Room
    for the share is the caller's question.)"""
    return (not models or model in models) and (pool == "vgpu" or share >= MILLI_PER_GPU)


#: Bits of one part's lane in `FragmentationMeter.lanes`: GPUs that fit the part, and
#: their free milli-GPU (wide enough for any node of fewer than 2^24 GPUs).
_COUNT_BITS = 24
_USE_BITS = 40
_COUNT_MASK = (1 << _COUNT_BITS) - 1
_USE_MASK = (1 << _USE_BITS) - 1


class FragmentationMeter:
    """F_n (numerator: milli-GPU x weight) of node states, memoised.

    The workload's GPU shapes come in few GPU parts (count, share, models: all a shape's
    fragment reads besides CPU; most shapes differ only in CPU). Of a node's
    GPUs, a part can use those that fit it, when there are enough of them. So

        F_n = idle x W - sum over parts p of W_k[p] x use_p,

    W being the workload's weight, use_p the free share of the GPUs that fit p (0 when
    fewer than p's count fit), and W_k[p] the weight of p's shapes among the first k
    by CPU request, k being how many the node's free CPU can host (`cpu_class`): a
    shape that cannot run there counts all the idle share, the weighted sum of §4.

    Each GPU state (model, pool, free) gives, per part, 1 to the count of GPUs that fit
    it and its free share to the use, packed into two integers with a lane per part
    (`lanes`): a node's sums are one addition per GPU, and a choice of GPUs changes them
    by the lanes of the GPUs it takes, before and after (`value`), without a new state.
    """

    def __init__(self, workload: Workload, cache_limit: int = 200_000) -> None:
        self.workload = workload
        self.total = workload.total or 1
        self._cache: dict[NodeState, int] = {}
        self._sums: dict[tuple[GpuState, ...], tuple[int, int, int]] = {}
        self._lanes: dict[GpuState, tuple[int, int]] = {}
        self._limit = cache_limit
        cpu_only_weight = sum(w for shape, w in workload.shapes if shape.gpus == 0)
        gpu_shapes = sorted(
            ((shape, w) for shape, w in workload.shapes if shape.gpus > 0),
            key=lambda item: item[0].cpu_milli,
        )
        self._gpu_shapes = gpu_shapes
        self._cpu_thresholds = [shape.cpu_milli for shape, _ in gpu_shapes]
        self._weight = cpu_only_weight + sum(w for _, w in gpu_shapes)
        #: Each GPU part once, in the order its first shape comes (by CPU).
        self._parts = list(dict.fromkeys((s.gpus, s.gpu_milli, s.models) for s, _ in gpu_shapes))
        lane = {part: number for number, part in enumerate(self._parts)}
        #: Per class k: (count lane shift, use lane shift, GPUs the part needs, W_k[p]) of
        #: each part among the first k shapes.
        self._rows: list[tuple[tuple[int, int, int, int], ...]] = [()]
        weights: dict[int, int] = {}
        for shape, weight in gpu_shapes:
            number = lane[(shape.gpus, shape.gpu_milli, shape.models)]
            weights[number] = weights.get(number, 0) + weight
            self._rows.append(
                tuple(
                    (p * _COUNT_BITS, p * _USE_BITS, self._parts[p][0], w)
                    for p, w in sorted(weights.items())
                )
            )

    def lanes(self, model: str, pool: str, free: int) -> tuple[int, int]:
        """(count, use) of one GPU state: per part, 1 and `free` where the GPU fits it."""
        key = (model, pool, free)
        found = self._lanes.get(key)
        if found is None:
            counts = uses = 0
            for number, (_, share, models) in enumerate(self._parts):
                if free >= share and usable(models, share, model, pool):
                    counts |= 1 << (number * _COUNT_BITS)
                    uses |= free << (number * _USE_BITS)
            found = self._lanes[key] = (counts, uses)
        return found

    def sums(self, gpus: tuple[GpuState, ...]) -> tuple[int, int, int]:
        """(count lanes, use lanes, idle share) of a node's GPU states."""
        found = self._sums.get(gpus)
        if found is None:
            counts = uses = idle = 0
            lanes = self.lanes
            for model, pool, free in gpus:
                count, use = lanes(model, pool, free)
                counts += count
                uses += use
                idle += free
            if len(self._sums) >= self._limit:
                self._sums.clear()
            found = self._sums[gpus] = (counts, uses, idle)
        return found

    def value(self, counts: int, uses: int, idle: int, fits: int) -> int:
        """F_n of GPUs with these sums (`sums`), on a node whose free CPU hosts the first
        `fits` GPU shapes (`cpu_class`)."""
        value = idle * self._weight
        for count_shift, use_shift, needed, weight in self._rows[fits]:
            if (counts >> count_shift) & _COUNT_MASK >= needed:
                value -= weight * ((uses >> use_shift) & _USE_MASK)
        return value

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
        value = self.value(*self.sums(gpus), self.cpu_class(cpu_free))
        if len(self._cache) >= self._limit:
            self._cache.clear()
        self._cache[state] = value
        return value

    def of_node(self, node: NodeView) -> int:
        return self.of_state(node_state(node))

    def milli(self, numerator: int) -> float:
        """The numerator as milli-GPU (for reports, never for decisions)."""
        return numerator / self.total

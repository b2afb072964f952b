"""The placement policies gpuloom ships: filter (shared, in the engine) + integer score.

`bestfit`, `dotprod`, `pack` (GpuPacking), `random` and `fgd` follow the
definitions of the FGD paper's simulator exactly (EVALUATION.md §3), so the
trace simulator can be checked against the published numbers; `spread` is
bestfit's mirror; `loom` is gpuloom's own (see its docstring). Scores are
computed in integers (or floored exactly once) and every tie is broken by the
engine's total order (score, then lowest node rank).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gpuloom.placement.engine import Context
from gpuloom.placement.fragmentation import FragmentationMeter, NodeState, Workload, node_state
from gpuloom.placement.resources import (
    WHOLE,
    GpuView,
    NodeView,
    Request,
    best_fit_gpus,
    memory_signature,
    serving_gpus,
)

#: Largest node of the reference trace: the normalisers of bestfit and dotprod.
MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8_000


class _Base:
    name = ""
    version = 1
    grouped = True

    @property
    def params(self) -> Mapping[str, Any]:
        return {}

    def normalize(self, scores: list[int]) -> list[int]:
        return scores

    def pick(self, node: NodeView, request: Request, context: Context) -> list[GpuView]:
        return best_fit_gpus(request, node)


def _cpu_free(node: NodeView) -> int:
    return node.cpu_free_milli if node.cpu_free_milli is not None else 0


class BestFit(_Base):
    """Least capacity left over (CPU and GPU, equal weight), min-max normalised."""

    name = "bestfit"
    version = 2

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        cpu_left = (_cpu_free(node) - request.cpu_milli) * MAX_GPU_MILLI
        gpu_left = (node.gpu_milli_free - request.gpu_demand_milli) * MAX_CPU_MILLI
        scale = MAX_CPU_MILLI * MAX_GPU_MILLI
        # floor(100 * (1 - (0.5 * cpu_left / MaxCPU + 0.5 * gpu_left / MaxGPU))), exactly
        return (100 * scale - 50 * (cpu_left + gpu_left)) // scale

    def normalize(self, scores: list[int]) -> list[int]:
        low, high = min(scores), max(scores)
        if high == low:
            return [0] * len(scores)
        return [(s - low) * 100 // (high - low) for s in scores]


class Spread(BestFit):
    """Most capacity left over: spreads load (and heat) across nodes."""

    name = "spread"
    version = 1

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        return -super().score(node, request, context)


class DotProd(_Base):
    """Smallest dot product of free capacity and demand (as the FGD simulator does)."""

    name = "dotprod"

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        cpu = _cpu_free(node) * request.cpu_milli * MAX_GPU_MILLI**2
        gpu = node.gpu_milli_free * request.gpu_demand_milli * MAX_CPU_MILLI**2
        scale = MAX_CPU_MILLI**2 * MAX_GPU_MILLI**2
        # floor(100 * (1 - dot / 2))
        return (100 * 2 * scale - 100 * (cpu + gpu)) // (2 * scale)


class Pack(_Base):
    """GpuPacking: already shared GPUs first, then used nodes, then the smallest empty node."""

    name = "pack"

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        if request.gpus == 0:
            return 0
        count = len(node.gpus)
        if all(g.milli_free == WHOLE for g in node.gpus):
            return max(33 - count, count)
        usable = sorted(g.milli_free for g in serving_gpus(request, node))[: request.gpus]
        whole = sum(1 for free in usable if free == WHOLE)
        if whole:
            return max(50 - whole, 33)
        used = sum(free * 100 // WHOLE for free in usable)
        return max(100 - used // 10, 50)


def _mix(*values: int) -> int:
    """splitmix64 over `values`: a seeded, platform-independent pseudo-random integer."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        state ^= state >> 31
        state = state * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        state ^= state >> 29
    return state


class Random(_Base):
    """A uniformly random feasible node, seeded by the decision's seed and position."""

    name = "random"
    grouped = False

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        return _mix(context.seed, context.position, node.rank)

    def pick(self, node: NodeView, request: Request, context: Context) -> list[GpuView]:
        if not request.fractional:
            return best_fit_gpus(request, node)
        gpus = serving_gpus(request, node)
        gpus.sort(key=lambda g: (_mix(context.seed, context.position, node.rank, g.index), g.index))
        return gpus[: request.gpus]


class _FragmentationAware(_Base):
    """Shared by fgd and loom: the change in the node's fragmentation a choice causes."""

    def __init__(self) -> None:
        self._meters: dict[int, FragmentationMeter] = {}

    def meter(self, context: Context) -> FragmentationMeter:
        workload = context.workload
        if not isinstance(workload, Workload):
            raise ValueError(f"policy {self.name} needs a typical workload in its context")
        meter = self._meters.get(id(workload))
        if meter is None or meter.workload is not workload:
            meter = FragmentationMeter(workload)
            self._meters = {id(workload): meter}
        return meter

    def after(self, node: NodeView, request: Request, chosen: list[GpuView]) -> NodeState:
        taken = {g.index for g in chosen}
        cpu = node.cpu_free_milli
        if cpu is not None:
            cpu -= request.cpu_milli
        gpus = tuple(
            sorted(
                (g.model, g.pool, g.milli_free - (request.gpu_milli if g.index in taken else 0))
                for g in node.gpus
            )
        )
        return (cpu, gpus)

    def best_choice(
        self, node: NodeView, request: Request, context: Context
    ) -> tuple[int, list[GpuView]]:
        """(Δ numerator, GPUs): for a fraction the GPU whose use fragments least
        (first index on ties); whole GPUs are interchangeable, the lowest idle ones."""
        meter = self.meter(context)
        before = meter.of_state(node_state(node))
        if request.gpus == 0 or not request.fractional:
            chosen = best_fit_gpus(request, node)
            return meter.of_state(self.after(node, request, chosen)) - before, chosen
        best: tuple[int, list[GpuView]] | None = None
        for gpu in sorted(serving_gpus(request, node), key=lambda g: g.index):
            if request.gpus == 1:
                chosen = [gpu]
            else:  # k slices: this GPU plus the best-fitting others
                rest = [g for g in best_fit_gpus(request, node) if g.index != gpu.index]
                chosen = [gpu, *rest[: request.gpus - 1]]
            delta = meter.of_state(self.after(node, request, chosen)) - before
            if best is None or delta < best[0]:
                best = (delta, chosen)
        assert best is not None
        return best

    def pick(self, node: NodeView, request: Request, context: Context) -> list[GpuView]:
        return self.best_choice(node, request, context)[1]


class _MemoisedDelta(_FragmentationAware):
    """Δ depends only on the node's state and the request's shape, and both recur
    (many nodes share states, many tasks share shapes): memoise it."""

    def __init__(self, cache_limit: int = 500_000) -> None:
        super().__init__()
        self._deltas: dict[tuple[object, ...], int] = {}
        self._limit = cache_limit
        self._workload: object = None

    def delta(self, node: NodeView, request: Request, context: Context) -> int:
        if context.workload is not self._workload:
            self._deltas.clear()
            self._workload = context.workload
        key = (node_state(node), memory_signature(node), request.shape())
        cached = self._deltas.get(key)
        if cached is None:
            cached = self.best_choice(node, request, context)[0]
            if len(self._deltas) >= self._limit:
                self._deltas.clear()
            self._deltas[key] = cached
        return cached


class FGD(_MemoisedDelta):
    """Fragmentation gradient descent, scored as the published simulator does:
    floor(100 * sigmoid(-Δ / 1000)), so nearby Δs tie and go to the lowest rank."""

    name = "fgd"

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        milli = self.delta(node, request, context) / self.meter(context).total
        return math.floor(100 / (1 + math.exp(milli / 1000)))


class Loom(_MemoisedDelta):
    """gpuloom's policy: FGD's fragmentation gradient, then nodes already in use.

    Like FGD it scores a node by floor(100 * sigmoid(-Δ / 1000)), Δ being the
    growth of the node's expected fragment against the typical workload. Among
    nodes in the same bucket FGD lets the (random) node rank decide; Loom first
    prefers a node that already holds work, so idle nodes stay idle for the
    tasks that need whole GPUs or whole nodes, and only then goes by rank.

    Scoring the exact Δ instead of the bucket was tried and is worse on the
    Alibaba trace (5.7% unallocated against 4.7%), as is best fit inside a
    bucket (4.95%): see docs/benchmarks.md.
    """

    name = "loom"

    @property
    def params(self) -> Mapping[str, Any]:
        return {"temperature_milli": 1000, "prefer_used_nodes": True}

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        milli = self.delta(node, request, context) / self.meter(context).total
        bucket = math.floor(100 / (1 + math.exp(milli / 1000)))
        used = any(not g.idle for g in node.gpus)
        return bucket * 2 + (1 if used else 0)


def shipped_policies() -> list[Any]:
    return [BestFit(), Spread(), DotProd(), Pack(), Random(), FGD(), Loom()]

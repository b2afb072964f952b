"""Fragmentation-aware policies (fgd, loom): the change in a node's fragmentation a
choice causes, against the cluster's typical workload."""

from __future__ import annotations

import math
from typing import Self

from gpuloom.placement.engine import Context
from gpuloom.placement.fragmentation import FragmentationMeter, Workload, node_state
from gpuloom.placement.gap_value import GapValues
from gpuloom.placement.policies.base import PolicyBase
from gpuloom.placement.resources import (
    GpuView,
    NodeView,
    Request,
    best_fit_gpus,
    gpu_signature,
    serving_gpus,
)

#: Submissions between two readings of the typical workload (version 2 of fgd and loom).
#: A divisor of the 1,000 specs the state keeps (`RECENT_SPECS_KEPT`).
WORKLOAD_EVERY = 100


class FragmentationAware(PolicyBase):
    """Shared by fgd and loom: the change in the node's fragmentation a choice causes.

    Version 2 reads the typical workload every `WORKLOAD_EVERY` submissions (the
    shapes of the 1,000 submitted up to the last multiple of it). Version 1 read it
    at every submission, so on a busy cluster every cycle met a new workload, and
    every score, kept heap and memoised Δ was thrown away: at 5,000 nodes that
    was most of a cycle (docs/benchmarks.md). `retired` gives version 1 back, for
    `gpuloom audit` to re-make the decisions of logs written with it.
    """

    needs_workload = True
    version = 2
    workload_every = WORKLOAD_EVERY

    def __init__(self) -> None:
        self._meters: dict[int, FragmentationMeter] = {}

    @classmethod
    def retired(cls) -> Self:
        """Version 1: the same scores, the typical workload read at every submission."""
        policy = cls()
        policy.version = 1
        policy.workload_every = 1
        return policy

    def meter(self, context: Context) -> FragmentationMeter:
        workload = context.workload
        if not isinstance(workload, Workload):
            raise ValueError(f"policy {self.name} needs a typical workload in its context")
        meter = self._meters.get(id(workload))
        if meter is None or meter.workload is not workload:
            meter = FragmentationMeter(workload)
            self._meters = {id(workload): meter}
        return meter

    def best_choice(
        self, node: NodeView, request: Request, context: Context
    ) -> tuple[int, list[GpuView]]:
        """(Δ numerator, GPUs): for a fraction the GPU whose use fragments least
        (first index on ties); whole GPUs are interchangeable, the lowest idle ones.

        The state after a choice is never built: the node's lane sums change by the
        lanes of the GPUs it takes, before and after (`FragmentationMeter.value`).
        A policy that values gaps (`gap_values`, loom v4) adds, for a share on one GPU,
        the change in what the GPU's free share is expected to end as, in Δ's units."""
        meter = self.meter(context)
        cpu, gpus = node_state(node)
        counts, uses, idle = meter.sums(gpus)
        before = meter.value(counts, uses, idle, meter.cpu_class(cpu))
        fits = meter.cpu_class(cpu - request.cpu_milli if cpu is not None else None)
        milli, lanes = request.gpu_milli, meter.lanes

        def delta(chosen: list[GpuView]) -> int:
            after_counts, after_uses = counts, uses
            for gpu in chosen:
                count, use = lanes(gpu.model, gpu.pool, gpu.milli_free)
                taken_count, taken_use = lanes(gpu.model, gpu.pool, gpu.milli_free - milli)
                after_counts += taken_count - count
                after_uses += taken_use - use
            return meter.value(after_counts, after_uses, idle - milli * len(chosen), fits) - before

        if request.gpus == 0 or not request.fractional:
            chosen = best_fit_gpus(request, node)
            return delta(chosen), chosen
        gaps = self.gap_values(context) if request.gpus == 1 else None
        best: tuple[int, list[GpuView]] | None = None
        tried: set[tuple[str, str, int]] = set()
        for gpu in sorted(serving_gpus(request, node), key=lambda g: g.index):
            if request.gpus == 1:
                # Two GPUs of the same model, pool and free share leave the same state
                # behind: the first (lowest index) stands for both, as it wins their tie.
                alike = (gpu.model, gpu.pool, gpu.milli_free)
                if alike in tried:
                    continue
                tried.add(alike)
                choice = [gpu]
            else:  # k slices: this GPU plus the best-fitting others
                rest = [g for g in best_fit_gpus(request, node) if g.index != gpu.index]
                choice = [gpu, *rest[: request.gpus - 1]]
            change = delta(choice)
            if gaps is not None and (request.models or gpu.model not in gaps.bound_models):
                free = gpu.milli_free
                change += (gaps.values[free - milli] - gaps.values[free]) * meter.total
            if best is None or change < best[0]:
                best = (change, choice)
        assert best is not None
        return best

    def gap_values(self, context: Context) -> GapValues | None:
        """What a GPU's free share will likely end as (loom version 4); None: not read."""
        return None

    def pick(self, node: NodeView, request: Request, context: Context) -> list[GpuView]:
        if request.gpus == 0 or not request.fractional:
            return best_fit_gpus(request, node)  # what `best_choice` takes, without its Δ
        return self.best_choice(node, request, context)[1]


class MemoisedDelta(FragmentationAware):
    """Δ depends only on the node's state and the request's shape, and both recur
    (many nodes share states, many tasks share shapes): memoise it.

    The key is what Δ reads, no more: the GPUs (`gpu_signature`), the request's GPU
    fields, and the node's free CPU only as the meter's CPU class before and after
    (`FragmentationMeter.cpu_class`); host memory, locality, selector and image only
    decide whether the node is scored at all. Nodes whose free CPU differs but not
    across a shape's CPU request then share one Δ. The key determines Δ, so what the
    memo holds never depends on which node filled it (the audit, with a memo of its
    own, remakes the same decisions).

    The key holds small numbers in place of the signature and the request's GPU fields
    (each numbered once per node change and per request in this policy's tables), so
    that looking Δ up, once per node a decision changed and per shape asked again,
    hashes four integers instead of every GPU's fields.
    """

    def __init__(self, cache_limit: int = 500_000) -> None:
        super().__init__()
        self._deltas: dict[tuple[int, int, int, int], int] = {}
        self._limit = cache_limit
        self._workload: object = None
        #: The numbers of GPU signatures and of requests' GPU fields, forgotten with the
        #: memo (which they key): a view remembers its signature's number with the table's
        #: identity (`NodeView.cached_signature`), so a forgotten table's numbers are not read.
        self._signatures: dict[tuple[tuple[str, str, int, int, int], ...], int] = {}
        self._requests: dict[int, tuple[Request, int]] = {}
        self._request_parts: dict[tuple[object, ...], int] = {}

    def _forget(self) -> None:
        self._deltas = {}
        self._signatures = {}
        self._requests = {}
        self._request_parts = {}

    def _signature_number(self, node: NodeView) -> int:
        cached = node.cached_signature
        if cached is not None and cached[0] is self._signatures:
            return cached[1]
        signature = gpu_signature(node)
        number = self._signatures.get(signature)
        if number is None:
            number = self._signatures[signature] = len(self._signatures)
        node.cached_signature = (self._signatures, number)
        return number

    def _request_number(self, request: Request) -> int:
        found = self._requests.get(id(request))
        if found is not None and found[0] is request:
            return found[1]
        part = (
            request.gpus,
            request.gpu_milli,
            request.gpu_memory_mib,
            request.models,
            request.pool,
        )
        number = self._request_parts.get(part)
        if number is None:
            number = self._request_parts[part] = len(self._request_parts)
        self._requests[id(request)] = (request, number)
        return number

    def delta(self, node: NodeView, request: Request, context: Context) -> int:
        if context.workload is not self._workload:
            self._forget()
            self._workload = context.workload
        meter = self.meter(context)
        cpu = node.cpu_free_milli
        key = (
            self._signature_number(node),
            meter.cpu_class(cpu),
            meter.cpu_class(cpu - request.cpu_milli if cpu is not None else None),
            self._request_number(request),
        )
        cached = self._deltas.get(key)
        if cached is None:
            cached = self.best_choice(node, request, context)[0]
            if max(len(self._deltas), len(self._signatures), len(self._requests)) < self._limit:
                self._deltas[key] = cached
            else:
                self._forget()  # and the key's numbers with it: not filed
        return cached


def sigmoid_bucket(delta_milli: float) -> int:
    """floor(100 * sigmoid(-Δ / 1000)), Δ in thousandths of the cluster's total: 0..100."""
    return math.floor(100 / (1 + math.exp(delta_milli / 1000)))

"""gpuloom's policy: FGD's gradient with valued gaps and CPU stranding, then nodes in use."""

from __future__ import annotations

from collections.abc import Mapping
from fractions import Fraction
from typing import Any, Self

from gpuloom.placement.engine import Context
from gpuloom.placement.gap_value import COMPETITION, GapValues
from gpuloom.placement.policies.fragmentation_aware import MemoisedDelta, sigmoid_bucket
from gpuloom.placement.resources import NodeView, Request
from gpuloom.placement.scarcity import SCARCE_PRESSURE
from gpuloom.placement.stranding import CpuRate

#: Loom v5: how much a milli-GPU of expected stranding (`gpuloom.placement.stranding`)
#: weighs against a milli-GPU of FGD's Δ.
STRANDING_WEIGHT = Fraction(1)


class Loom(MemoisedDelta):
    """gpuloom's policy: FGD's fragmentation gradient, then nodes already in use.

    Like FGD it scores a node by floor(100 * sigmoid(-Δ / 1000)), Δ being the
    growth of the node's expected fragment against the typical workload. Among
    nodes in the same bucket FGD lets the (random) node rank decide; Loom first
    prefers a node that already holds work, so idle nodes stay idle for the
    tasks that need whole GPUs or whole nodes, and only then goes by rank.

    Version 3: a GPU task free to run on any model does not prefer a node in use
    when the node has GPUs of a model the workload's model-bound tasks would mostly
    take (`Workload.scarce`, `gpuloom.placement.scarcity`): preferring those nodes
    filled the bound tasks' models with work that could run anywhere. Tasks without
    a GPU still prefer them (their CPU is better spent where GPUs are already taken).
    Versions 1 and 2 (without it) stay registered for the audit.

    Version 4: a share on one GPU chooses its GPU, and is scored, by FGD's Δ plus the
    change in what the GPU's free share is expected to end as over the workload's
    shares (`gpuloom.placement.gap_value`): FGD looks one task ahead, and takes a gap
    that the next common share would nearly close for a smaller share that leaves a
    gap almost nothing fits. Not read for a task free to run anywhere on a GPU of a
    model that bound tasks ask for. Version 3 stays registered for the audit.

    Version 5: a node's score also counts the change in the GPU share its free CPU is
    expected not to carry (`gpuloom.placement.stranding`): FGD sees a node's CPU run
    out only once a shape no longer fits. Where the workload names GPU models only
    tasks without a GPU count it. Version 4 stays registered for the audit.

    Scoring the exact Δ instead of the bucket was tried and is worse on the
    Alibaba trace (5.7% unallocated against 4.7%), as is best fit inside a
    bucket (4.95%): see docs/benchmarks.md.
    """

    name = "loom"
    version = 5
    #: Twice FGD's bucket, plus one on a node already in use.
    SCORES = (0, 201)
    #: Version 3: no preference for a node in use that holds a scarce model, for a GPU
    #: task free to run anywhere.
    leaves_scarce_models = True

    #: Version 4: a share's choice of GPU also weighs what the gap it leaves will likely
    #: end as (`gpuloom.placement.gap_value`).
    values_gaps = True
    #: ... with this `competition` (`gap_value.COMPETITION`).
    gap_competition = COMPETITION
    #: Version 5: a node's score counts what its free CPU is expected to strand, with
    #: this weight (None: not counted).
    stranding_weight: Fraction | None = STRANDING_WEIGHT

    def __init__(self) -> None:
        super().__init__()
        self._gaps: GapValues | None = None
        self._cpu_rate: CpuRate | None = None

    @classmethod
    def retired(cls) -> Self:
        policy = super().retired()
        policy.leaves_scarce_models = False
        policy.values_gaps = False
        policy.stranding_weight = None
        return policy

    @classmethod
    def version_4(cls) -> Self:
        """Version 4: gaps valued, stranding not counted."""
        policy = cls()
        policy.version = 4
        policy.stranding_weight = None
        return policy

    @classmethod
    def version_3(cls) -> Self:
        """Version 3: scarce models left, gaps not valued."""
        return cls._earlier(3, leaves_scarce_models=True)

    @classmethod
    def version_2(cls) -> Self:
        """Version 2: the workload read every 100 submissions, scarce models not left."""
        return cls._earlier(2, leaves_scarce_models=False)

    @classmethod
    def _earlier(cls, version: int, *, leaves_scarce_models: bool) -> Self:
        policy = cls()
        policy.version = version
        policy.leaves_scarce_models = leaves_scarce_models
        policy.values_gaps = False
        policy.stranding_weight = None
        return policy

    def gap_values(self, context: Context) -> GapValues | None:
        if not self.values_gaps:
            return None
        workload = context.workload
        if self._gaps is None or self._gaps.workload is not workload:
            self._gaps = GapValues.of(workload, self.gap_competition)
        return self._gaps

    @property
    def params(self) -> Mapping[str, Any]:
        params: dict[str, Any] = {"temperature_milli": 1000, "prefer_used_nodes": True}
        if self.leaves_scarce_models:
            pressure = SCARCE_PRESSURE
            params["scarce_pressure"] = f"{pressure.numerator}/{pressure.denominator}"
        if self.values_gaps:
            competition = self.gap_competition
            params["gap_competition"] = f"{competition.numerator}/{competition.denominator}"
        if self.stranding_weight is not None:
            weight = self.stranding_weight
            params["stranding_weight"] = f"{weight.numerator}/{weight.denominator}"
        return params

    def stranding_change(self, node: NodeView, request: Request, context: Context) -> float:
        """What taking `request` adds to the GPU share the node's CPU will strand, in
        milli-GPU times the weight (`gpuloom.placement.stranding`); 0 when not counted
        (a GPU task where the workload names models), or the node reports no CPU."""
        weight, cpu = self.stranding_weight, node.cpu_free_milli
        if weight is None or cpu is None:
            return 0.0
        workload = context.workload
        if self._cpu_rate is None or self._cpu_rate.workload is not workload:
            self._cpu_rate = CpuRate.of(workload)
        rate = self._cpu_rate
        if rate.cpu <= 0 or (request.gpus and not rate.gpu_tasks_count):
            return 0.0
        gpu = sum(g.milli_free for g in node.gpus)
        before = rate.stranded(cpu, gpu)
        after = rate.stranded(cpu - request.cpu_milli, gpu - request.gpus * request.gpu_milli)
        return (after - before) * weight.numerator / (rate.cpu * weight.denominator)

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        change = self.delta(node, request, context) / self.meter(context).total
        bucket = sigmoid_bucket(change + self.stranding_change(node, request, context))
        used = any(not g.idle for g in node.gpus)
        if used and self.leaves_scarce_models and request.gpus and not request.models:
            scarce = context.workload.scarce
            used = not (scarce and any(g.model in scarce for g in node.gpus))
        return bucket * 2 + (1 if used else 0)

"""The GPU share a node is expected to strand: free GPU its free CPU will not carry.

GPU tasks ask CPU roughly in proportion to the GPU they take. A node that gives its
CPU to CPU-heavy shares, or to tasks without a GPU, runs out of CPU with GPUs still
free, and whatever comes next those GPUs stay idle. FGD sees this one task ahead
only: a node counts as fragment for a shape once its CPU is below that shape's
request, so two choices that leave a node 20 and 60 CPU cores can score the same while
the first strands GPUs a few tasks later. On the Alibaba trace, near saturation, the
GPUs left idle on nodes without the CPU to use them were where loom v4 lost to FGD
(docs/benchmarks.md, loom version 5).

`CpuRate` is the workload's CPU per GPU milli, r = sum(w * cpu) / sum(w * gpus * share)
over its GPU shapes (w: the shape's weight). Taking r as what the node's future tasks
will ask, a node with c CPU milli and g GPU milli free strands

    S(c, g) = max(0, g - c / r)

milli-GPU. Loom v5 adds the change a choice makes to S to FGD's Δ, in the same units.
Tasks without a GPU are left out of r: they can run on any node, and S steers them to
nodes whose CPU is more than their GPUs will need.

Where some shape of the workload names GPU models, only tasks without a GPU count S
(`CpuRate.gpu_tasks_count`). The nodes with CPU to spare are those of a few models (on
the trace, the T4 nodes), and S steered GPU tasks free to run anywhere onto them,
taking the GPUs the model-bound tasks needed: on the trace's gpuspec variants counting
S for GPU tasks was well above FGD, counting it for tasks without a GPU only was below
it (docs/benchmarks.md, loom version 5).

Integers throughout: S is returned as a numerator over `CpuRate.cpu`, so a score built
on it is the same on every machine and the audit re-makes the decision.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuloom.placement.fragmentation import Workload
from gpuloom.placement.gap_value import bound_models


@dataclass(frozen=True, slots=True)
class CpuRate:
    """r of one workload as a fraction: `cpu` CPU milli per `gpu` GPU milli;
    `gpu_tasks_count`: GPU tasks count S too (no shape of the workload names a model)."""

    workload: Workload
    cpu: int
    gpu: int
    gpu_tasks_count: bool

    @classmethod
    def of(cls, workload: Workload) -> CpuRate:
        cpu = sum(weight * shape.cpu_milli for shape, weight in workload.shapes if shape.gpus)
        gpu = sum(
            weight * shape.gpus * shape.gpu_milli for shape, weight in workload.shapes if shape.gpus
        )
        return cls(workload, cpu, gpu, not bound_models(workload))

    def stranded(self, cpu_free_milli: int, gpu_free_milli: int) -> int:
        """S(c, g) times `self.cpu`: 0 when the workload has no GPU shape or asks no CPU."""
        if self.cpu <= 0 or self.gpu <= 0:
            return 0
        return max(0, gpu_free_milli * self.cpu - max(cpu_free_milli, 0) * self.gpu)

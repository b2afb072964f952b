"""Best fit and its mirror, spread: capacity left over on the node."""

from __future__ import annotations

from gpuloom.placement.engine import Context
from gpuloom.placement.policies.base import MAX_CPU_MILLI, MAX_GPU_MILLI, PolicyBase, cpu_free
from gpuloom.placement.resources import NodeView, Request


class BestFit(PolicyBase):
    """Least capacity left over (CPU and GPU, equal weight), min-max normalised."""

    name = "bestfit"
    version = 2
    #: Min-max normalised over the feasible nodes.
    SCORES = (0, 100)

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        cpu_left = (cpu_free(node) - request.cpu_milli) * MAX_GPU_MILLI
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

"""A uniformly random feasible node, seeded from the log (the trace's baseline)."""

from __future__ import annotations

from gpuloom.placement.engine import Context
from gpuloom.placement.policies.base import PolicyBase
from gpuloom.placement.resources import GpuView, NodeView, Request, best_fit_gpus, serving_gpus


def _mix(*values: int) -> int:
    """splitmix64 over `values`: a seeded, platform-independent pseudo-random integer."""
    state = 0x9E3779B97F4A7C15
    for value in values:
        state = (state ^ (value & 0xFFFFFFFFFFFFFFFF)) * 0xBF58476D1CE4E5B9 & 0xFFFFFFFFFFFFFFFF
        state ^= state >> 31
        state = state * 0x94D049BB133111EB & 0xFFFFFFFFFFFFFFFF
        state ^= state >> 29
    return state


class Random(PolicyBase):
    """A uniformly random feasible node, seeded by the decision's seed and position."""

    name = "random"
    grouped = False
    #: A 64-bit pseudo-random number per node: only the order matters.
    SCORES = (0, 2**64 - 1)

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        return _mix(context.seed, context.position, node.rank)

    def pick(self, node: NodeView, request: Request, context: Context) -> list[GpuView]:
        if not request.fractional:
            return best_fit_gpus(request, node)
        gpus = serving_gpus(request, node)
        gpus.sort(key=lambda g: (_mix(context.seed, context.position, node.rank, g.index), g.index))
        return gpus[: request.gpus]

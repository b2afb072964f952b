"""GpuPacking (the FGD paper's simulator)."""

from __future__ import annotations

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.engine import Context
from gpuloom.placement.policies.base import PolicyBase
from gpuloom.placement.resources import NodeView, Request, serving_gpus


class Pack(PolicyBase):
    """GpuPacking: already shared GPUs first, then used nodes, then the smallest empty node."""

    name = "pack"

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        if request.gpus == 0:
            return 0
        count = len(node.gpus)
        if all(g.milli_free == MILLI_PER_GPU for g in node.gpus):
            return max(33 - count, count)
        usable = sorted(g.milli_free for g in serving_gpus(request, node))[: request.gpus]
        whole = sum(1 for free in usable if free == MILLI_PER_GPU)
        if whole:
            return max(50 - whole, 33)
        used = sum(free * 100 // MILLI_PER_GPU for free in usable)
        return max(100 - used // 10, 50)

"""Dot product of free capacity and demand (the FGD paper's simulator)."""

from __future__ import annotations

from gpuloom.placement.engine import Context
from gpuloom.placement.policies.base import MAX_CPU_MILLI, MAX_GPU_MILLI, PolicyBase, cpu_free
from gpuloom.placement.resources import NodeView, Request


class DotProd(PolicyBase):
    """Smallest dot product of free capacity and demand (as the FGD simulator does)."""

    name = "dotprod"

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        cpu = cpu_free(node) * request.cpu_milli * MAX_GPU_MILLI**2
        gpu = node.gpu_milli_free * request.gpu_demand_milli * MAX_CPU_MILLI**2
        scale = MAX_CPU_MILLI**2 * MAX_GPU_MILLI**2
        # floor(100 * (1 - dot / 2))
        return (100 * 2 * scale - 100 * (cpu + gpu)) // (2 * scale)

"""Pure placement: resources, the engine (shared rules, total order), policies, the cycle.

The same code serves the live placement service, `gpuloom audit` and the trace
simulator (`gpuloom sim`).
"""

from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.engine import Context, NodeIndex, Policy
from gpuloom.placement.incremental.index_cache import IndexCache
from gpuloom.placement.inputs import node_views, request_of
from gpuloom.placement.policies import (
    FGD,
    BestFit,
    DotProd,
    Loom,
    Pack,
    Random,
    Spread,
    shipped_policies,
)
from gpuloom.placement.registry import PolicyRegistry, default_registry
from gpuloom.placement.resources import GpuView, NodeView, Placement, Request
from gpuloom.placement.topology import place

__all__ = [
    "FGD",
    "BestFit",
    "Context",
    "DotProd",
    "GpuView",
    "IndexCache",
    "Loom",
    "NodeIndex",
    "NodeView",
    "Pack",
    "Placement",
    "Policy",
    "PolicyRegistry",
    "Random",
    "Request",
    "Spread",
    "default_registry",
    "node_views",
    "place",
    "placement_cycle",
    "request_of",
    "shipped_policies",
]

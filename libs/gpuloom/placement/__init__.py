"""Pure placement: policies (filter + score), their registry, and the placement cycle.

The same code serves the live placement service, audits and simulations.
"""

from gpuloom.placement.bestfit import BestFit
from gpuloom.placement.cycle import node_views, placement_cycle
from gpuloom.placement.policy import Choice, FreeGpu, NodeView, Policy, PolicyRegistry, Request


def default_registry() -> PolicyRegistry:
    """The policies gpuloom ships, registered explicitly."""
    registry = PolicyRegistry()
    registry.register(BestFit())
    return registry


__all__ = [
    "BestFit",
    "Choice",
    "FreeGpu",
    "NodeView",
    "Policy",
    "PolicyRegistry",
    "Request",
    "default_registry",
    "node_views",
    "placement_cycle",
]

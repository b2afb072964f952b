"""Fragmentation gradient descent (FGD), as the published simulator scores it."""

from __future__ import annotations

from gpuloom.placement.engine import Context
from gpuloom.placement.policies.fragmentation_aware import MemoisedDelta, sigmoid_bucket
from gpuloom.placement.resources import NodeView, Request


class FGD(MemoisedDelta):
    """Fragmentation gradient descent, scored as the published simulator does:
    floor(100 * sigmoid(-Δ / 1000)), so nearby Δs tie and go to the lowest rank."""

    name = "fgd"

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        return sigmoid_bucket(self.delta(node, request, context) / self.meter(context).total)

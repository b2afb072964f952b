"""Best fit: the node left with the fewest free GPUs after placing the job.

Packing jobs tightly keeps whole nodes free for large jobs. Score (lower wins)
is the number of eligible free GPUs left on the node; ties go to the node name.
Within a node the lowest free indexes are taken.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from gpuloom.placement.policy import Choice, NodeView, Request, eligible_gpus


class BestFit:
    name = "bestfit"
    version = 1

    @property
    def params(self) -> Mapping[str, Any]:
        return {}

    def choose(self, request: Request, nodes: Sequence[NodeView]) -> Choice | None:
        best: tuple[int, str] | None = None
        best_choice: Choice | None = None
        for node in nodes:
            gpus = eligible_gpus(request, node)
            if len(gpus) < request.gpus:
                continue
            key = (len(gpus) - request.gpus, node.name)
            if best is None or key < best:
                best = key
                best_choice = Choice(node.name, tuple(gpus[: request.gpus]))
        return best_choice

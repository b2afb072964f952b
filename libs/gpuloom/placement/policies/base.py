"""What every shipped policy shares: the defaults of the engine's `Policy` protocol.

A policy scores each node that passed the filters (`gpuloom.placement.filters`) with
an integer, higher wins, ties to the lowest node rank (the engine's total order).
Each policy states the range of the scores the engine compares (`SCORES`, after
`normalize`) for nodes no larger than the reference trace's largest
(`MAX_CPU_MILLI`, `MAX_GPU_MILLI`); tests/unit/placement/test_policy_scores.py holds
them to it. `needs_workload`: the policy reads the cluster's typical workload from its
context (`Context.workload`), which the placement cycle then derives from the log.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

from gpuloom.placement.engine import Context
from gpuloom.placement.resources import GpuView, NodeView, Request, best_fit_gpus

#: Largest node of the reference trace: the normalisers of bestfit and dotprod.
MAX_CPU_MILLI = 128_000
MAX_GPU_MILLI = 8_000


class PolicyBase:
    name = ""
    version = 1
    grouped = True
    #: The policy scores against the typical workload (`Context.workload`).
    needs_workload = False
    #: How often the placement cycle reads that workload again, in submissions
    #: (`gpuloom.placement.inputs.typical_workload`); 1: at every submission.
    workload_every = 1
    #: The lowest and highest score the engine compares (after `normalize`).
    SCORES: ClassVar[tuple[int, int]] = (0, 100)

    @property
    def params(self) -> Mapping[str, Any]:
        return {}

    def normalize(self, scores: list[int]) -> list[int]:
        return scores

    def pick(self, node: NodeView, request: Request, context: Context) -> list[GpuView]:
        return best_fit_gpus(request, node)


def cpu_free(node: NodeView) -> int:
    return node.cpu_free_milli if node.cpu_free_milli is not None else 0

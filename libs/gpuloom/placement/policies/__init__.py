"""The placement policies gpuloom ships, one module each: filter (shared,
`gpuloom.placement.filters`) + integer score (`base` says what they share).

`bestfit`, `dotprod`, `pack` (GpuPacking), `random` and `fgd` follow the
definitions of the FGD paper's simulator exactly (EVALUATION.md §3), so the
trace simulator can be checked against the published numbers; `spread` is
bestfit's mirror; `loom` is gpuloom's own (see its docstring). Scores are
computed in integers (or floored exactly once) and every tie is broken by the
engine's total order (score, then lowest node rank).
"""

from __future__ import annotations

from gpuloom.placement.engine import Policy
from gpuloom.placement.policies.base import MAX_CPU_MILLI, MAX_GPU_MILLI, PolicyBase
from gpuloom.placement.policies.bestfit import BestFit, Spread
from gpuloom.placement.policies.dotprod import DotProd
from gpuloom.placement.policies.fgd import FGD
from gpuloom.placement.policies.fragmentation_aware import FragmentationAware, MemoisedDelta
from gpuloom.placement.policies.loom import Loom
from gpuloom.placement.policies.pack import Pack
from gpuloom.placement.policies.seeded import Random


def shipped_policies() -> list[Policy]:
    return [BestFit(), Spread(), DotProd(), Pack(), Random(), FGD(), Loom()]


def retired_policies() -> list[Policy]:
    """Earlier versions of shipped policies, kept so that `gpuloom audit` re-makes the
    decisions of logs written with them (configuration picks only the current ones)."""
    return [FGD.retired(), Loom.retired(), Loom.version_2(), Loom.version_3(), Loom.version_4()]


__all__ = [
    "FGD",
    "MAX_CPU_MILLI",
    "MAX_GPU_MILLI",
    "BestFit",
    "DotProd",
    "FragmentationAware",
    "Loom",
    "MemoisedDelta",
    "Pack",
    "PolicyBase",
    "Random",
    "Spread",
    "retired_policies",
    "shipped_policies",
]

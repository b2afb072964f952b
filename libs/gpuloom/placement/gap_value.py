"""What a GPU's free share is likely to be worth: the waste it is expected to end as.

FGD counts a GPU's free share as fragment for each workload shape it cannot host
now: one task ahead. It does not see that some gaps are nearly always filled and
others nearly never. On the Alibaba trace a GPU with 530 left after a 470 share is
usually filled by the next 470 (60 left), while the 210 left when a 320 share takes
that gap waits for the rare shares of 210 or less. FGD scores the two choices of a
320 share, into a 530 gap or into a 680 one, the other way round.

`gap_values` looks further ahead, over the workload's GPU shares. A gap of f milli
is filled next by a share drawn from the shares that fit it, in the workload's
proportions (counted per GPU they take). The gap is never filled, and ends as waste,
with the probability that this wait outlasts the arrivals. That probability is
modelled as `competition / (competition + p)`, p being the share of GPU requests
that fit f: a gap most requests fit is soon filled, one few fit mostly stays. So

    W(f) = h(f) * f + (1 - h(f)) * Σ_k q_k(f) * W(f - s_k),   h(f) = c / (c + p(f)),

and W(f) = f when nothing fits. `competition` (c) was chosen on seeds other than the
benchmark's (docs/benchmarks.md, loom version 4).

The table holds whole milli (rounded once), so scores built on it stay integers and
a decision is re-made exactly by the audit.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from fractions import Fraction

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.fragmentation import Workload

#: c above: how long a gap waits, relative to the share of requests that fit it.
COMPETITION = Fraction(1, 5)


def gap_values(workload: Workload, competition: Fraction = COMPETITION) -> tuple[int, ...]:
    """W(f) for f = 0..1000 milli of one GPU, in milli (see the module's docstring)."""
    weights: Counter[int] = Counter()
    for shape, weight in workload.shapes:
        if shape.gpus and 0 < shape.gpu_milli <= MILLI_PER_GPU:  # a share of 0 would fill nothing
            weights[shape.gpu_milli] += weight * shape.gpus
    total = sum(weights.values())
    sizes = sorted(weights)
    c = float(competition)
    values = [0.0] * (MILLI_PER_GPU + 1)
    for free in range(1, MILLI_PER_GPU + 1):
        fitting = [size for size in sizes if size <= free]
        if not fitting:
            values[free] = float(free)
            continue
        mass = sum(weights[size] for size in fitting)
        never = c / (c + mass / total)
        ahead = sum(weights[size] * values[free - size] for size in fitting) / mass
        values[free] = never * free + (1 - never) * ahead
    return tuple(round(value) for value in values)


def bound_models(workload: Workload) -> frozenset[str]:
    """The GPU models some shape of the workload is bound to."""
    return frozenset(model for shape, _ in workload.shapes for model in shape.models)


@dataclass(frozen=True, slots=True)
class GapValues:
    """W of one workload, and the models whose gaps it is not read on for a task free to
    run anywhere: a gap of a model that bound tasks ask for is theirs to fill. Drawing
    unbound shares into those gaps took the bound tasks' capacity on the trace's gpuspec
    variants (docs/benchmarks.md, loom version 4), as preferring used nodes did (loom v3,
    `gpuloom.placement.scarcity`)."""

    workload: Workload
    values: tuple[int, ...]
    bound_models: frozenset[str]

    @classmethod
    def of(cls, workload: Workload, competition: Fraction = COMPETITION) -> GapValues:
        return cls(workload, gap_values(workload, competition), bound_models(workload))

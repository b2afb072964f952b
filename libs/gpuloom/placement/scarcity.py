"""GPU models the typical workload's model-bound tasks would mostly take (loom v3).

On a cluster where a share of the tasks may only run on some GPU models (the trace's
gpuspec variants: a task for T4 only), capacity of those models that tasks free to run
anywhere take is capacity the bound tasks then miss. A model is scarce when the
demand of the shapes bound to it is a large share of its supply, measured against the
cluster as a whole: with `bound(m)` the milli-GPU the workload's bound shapes ask of
model `m` (a shape that allows several models counts evenly toward each),

    pressure(m) = (bound(m) / supply(m)) / (demand / supply)

`demand` is all the shapes' milli-GPU and `supply` the cluster's GPUs. A pressure of 1
means the bound tasks alone would take the model's fair share of the load. Loom (v3)
stops preferring a node already in use for a GPU task free to run anywhere when the
node's GPUs include a scarce model: on the trace's gpuspec variants that is the change
that turned loom's losses to FGD into gains (docs/benchmarks.md). Computed in exact
fractions from the workload and the nodes alone, so the audit re-derives it.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from fractions import Fraction

from gpuloom.placement.fragmentation import Workload

#: A model is scarce above this pressure. Chosen on the trace's gpuspec variants
#: (0.2 and 0.5 were each worse on one of them): docs/benchmarks.md.
SCARCE_PRESSURE = Fraction(3, 10)


def scarce_models(
    workload: Workload, supply: Mapping[str, int], pressure: Fraction = SCARCE_PRESSURE
) -> frozenset[str]:
    """The models whose pressure (above) exceeds `pressure`; `supply`: GPUs per model. A
    model the cluster has none of is not scarce (no node holds it)."""
    bound: defaultdict[str, Fraction] = defaultdict(Fraction)
    demand = 0
    for shape, weight in workload.shapes:
        need = weight * shape.gpus * shape.gpu_milli
        demand += need
        if shape.models and need:
            for model in shape.models:
                bound[model] += Fraction(need, len(shape.models))
    total = sum(supply.values())
    if not demand or not total:
        return frozenset()
    return frozenset(
        model
        for model, asked in bound.items()
        if supply.get(model, 0) > 0 and asked * total > pressure * supply[model] * demand
    )


def with_scarcity(workload: Workload, gpu_models: Iterable[str]) -> Workload:
    """`workload` with its `scarce` models, for a cluster whose GPUs are `gpu_models`
    (one entry per GPU). Without a model-bound shape nothing is counted."""
    if not any(shape.models for shape, _ in workload.shapes):
        return workload
    return dataclasses.replace(workload, scarce=scarce_models(workload, Counter(gpu_models)))

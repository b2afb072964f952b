"""Multifactor priority (as Slurm's priority/multifactor): a weighted sum of factors.

priority = w_class * class + w_age * age + w_fairshare * fairshare + w_size * size

Every factor is in [0, 1]: the job's priority class scaled to its range, its age
in the queue against `max_age_s`, its account's fair-share factor, and its size
(GPU demand against the cluster's GPUs). The result is an integer (the factors
rounded to 1e-6 before weighting), so the queue order is exact and total with the
tie-breaks of `queue_key`.
"""

from __future__ import annotations

from dataclasses import dataclass

FACTOR_SCALE = 1_000_000


@dataclass(frozen=True, slots=True)
class PriorityWeights:
    priority_class: int = 10_000
    age: int = 1_000
    fair_share: int = 5_000
    size: int = 500
    #: Age at which the age factor reaches 1.
    max_age_s: float = 7 * 24 * 3600.0
    #: The range of the user-facing `priority` field mapped to [0, 1].
    class_min: int = -1_000_000
    class_max: int = 1_000_000


@dataclass(frozen=True, slots=True)
class PriorityFactors:
    """Each factor in [0, 1] (scaled by FACTOR_SCALE) and the weighted total."""

    priority_class: int
    age: int
    fair_share: int
    size: int
    total: int


def _scaled(value: float) -> int:
    return round(min(1.0, max(0.0, value)) * FACTOR_SCALE)


def multifactor_priority(
    weights: PriorityWeights,
    *,
    priority: int,
    waited_s: float,
    fair_share: float,
    gpu_milli_demand: int,
    cluster_gpu_milli: int,
) -> PriorityFactors:
    span = weights.class_max - weights.class_min
    factors = (
        _scaled((priority - weights.class_min) / span if span else 0.0),
        _scaled(waited_s / weights.max_age_s if weights.max_age_s > 0 else 1.0),
        _scaled(fair_share),
        _scaled(gpu_milli_demand / cluster_gpu_milli if cluster_gpu_milli > 0 else 0.0),
    )
    total = (
        weights.priority_class * factors[0]
        + weights.age * factors[1]
        + weights.fair_share * factors[2]
        + weights.size * factors[3]
    )
    return PriorityFactors(*factors, total=total)

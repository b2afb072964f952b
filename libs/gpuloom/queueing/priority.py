"""Multifactor priority (as Slurm's priority/multifactor), in priority points.

    points = priority + w_age * age + w_fair_share * fair_share + w_size * size

`priority` is the job's own priority (its class, an integer); each other factor
is in [0, 1]: its age in the queue against `max_age_s`, its account's fair-share
factor, and its size (GPU demand against the cluster's GPUs). A weight is the
most points its factor can add: with `age = 100`, a week-old job gains up to 100
priority points. All weights 0 (the default) is plain priority, then submission
order. Totals are integers in micro-points (factors fixed to 1e-6), so the order
is exact and total with the tie-breaks of the queue.
"""

from __future__ import annotations

from dataclasses import dataclass

FACTOR_SCALE = 1_000_000


@dataclass(frozen=True, slots=True)
class PriorityWeights:
    age: int = 0
    fair_share: int = 0
    size: int = 0
    #: Age at which the age factor reaches 1.
    max_age_s: float = 7 * 24 * 3600.0

    @property
    def plain(self) -> bool:
        """Only the job's own priority counts."""
        return self.age == 0 and self.fair_share == 0 and self.size == 0


@dataclass(frozen=True, slots=True)
class PriorityFactors:
    """The job's priority, each factor in [0, 1] (scaled by FACTOR_SCALE), the total."""

    priority: int
    age: int
    fair_share: int
    size: int
    #: Micro-points: priority * FACTOR_SCALE + the weighted factors.
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
    age = _scaled(waited_s / weights.max_age_s if weights.max_age_s > 0 else 1.0)
    share = _scaled(fair_share)
    size = _scaled(gpu_milli_demand / cluster_gpu_milli if cluster_gpu_milli > 0 else 0.0)
    total = (
        priority * FACTOR_SCALE
        + weights.age * age
        + weights.fair_share * share
        + weights.size * size
    )
    return PriorityFactors(priority, age, share, size, total)

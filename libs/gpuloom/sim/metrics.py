"""The published metrics of a run (EVALUATION.md §2.6): U(x), fragmentation amount and ratio.

For each integer x, the bucket is the arrivals after which round(100 * arrived / C)
equals x (half to even, as pandas rounds), or within x ± 1 when none does; a
metric is the mean over the bucket of its per-arrival value, each rounded to two
decimals, and the mean rounded to two decimals too.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from gpuloom.sim.replay import Run

X_RANGE = range(0, 131)


@dataclass(frozen=True, slots=True)
class Curves:
    """Per x in 0..130: unallocated GPU %, fragmentation % of capacity and % of idle."""

    unallocated: dict[int, float]
    frag_amount: dict[int, float]
    frag_ratio: dict[int, float]


def _buckets(run: Run) -> dict[int, list[int]]:
    by_x: dict[int, list[int]] = {}
    for i, arrived in enumerate(run.arrived):
        by_x.setdefault(round(100 * arrived / run.capacity_milli), []).append(i)
    return by_x


def curves(run: Run) -> Curves:
    by_x = _buckets(run)
    capacity = run.capacity_milli
    unallocated: dict[int, float] = {}
    amount: dict[int, float] = {}
    ratio: dict[int, float] = {}
    for x in X_RANGE:
        bucket = by_x.get(x) or [i for d in (-1, 0, 1) for i in by_x.get(x + d, [])]
        if not bucket:
            continue
        allocated = [round(100 * run.allocated[i] / capacity, 2) for i in bucket]
        unallocated[x] = round(100 - round(statistics.fmean(allocated), 2), 2)
        amount[x] = round(
            statistics.fmean(100 * run.fragmentation[i] / capacity for i in bucket), 2
        )
        ratio[x] = round(
            statistics.fmean(
                100 * run.fragmentation[i] / max(1, capacity - run.allocated[i]) for i in bucket
            ),
            2,
        )
    return Curves(unallocated, amount, ratio)

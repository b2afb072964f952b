"""Summaries of what-if runs over seeds, the published FGD results, JSON and a plot.

`summarize` turns the runs of one policy on one trace into the figures of
EVALUATION.md §6: U(100) mean and median over seeds, the mean curve U(x) for
x = 75..130, fragmentation amount and ratio at x = 100, and failed tasks by type.
"""

from __future__ import annotations

import csv
import statistics
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuloom.sim.metrics import Curves, curves
from gpuloom.sim.replay import Run

CURVE_X = range(75, 131)

#: gpuloom policy name -> the published simulator's `sc_policy`.
PUBLISHED_NAMES = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "pack": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}


@dataclass(frozen=True, slots=True)
class Summary:
    policy: str
    trace: str
    seeds: list[int]
    u100: list[float]
    curve: dict[int, float]
    frag_amount: float
    frag_ratio: float
    failed_by_type: dict[str, float]
    seconds_per_seed: float

    @property
    def u100_mean(self) -> float:
        return round(statistics.fmean(self.u100), 2)

    @property
    def u100_median(self) -> float:
        return round(statistics.median(self.u100), 2)

    @property
    def u100_sd(self) -> float:
        return round(statistics.stdev(self.u100), 2) if len(self.u100) > 1 else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "trace": self.trace,
            "seeds": self.seeds,
            "u100_mean": self.u100_mean,
            "u100_median": self.u100_median,
            "u100_sd": self.u100_sd,
            "u100_per_seed": self.u100,
            "curve": {str(x): u for x, u in self.curve.items()},
            "frag_amount": self.frag_amount,
            "frag_ratio": self.frag_ratio,
            "failed_by_type": self.failed_by_type,
            "seconds_per_seed": round(self.seconds_per_seed, 2),
        }


def _mean_at(all_curves: list[dict[int, float]], x: int) -> float | None:
    values = [c[x] for c in all_curves if x in c]
    return round(statistics.fmean(values), 2) if values else None


def summarize(trace: str, runs: list[Run]) -> Summary:
    per_run: list[Curves] = [curves(run) for run in runs]
    curve = {
        x: value
        for x in CURVE_X
        if (value := _mean_at([c.unallocated for c in per_run], x)) is not None
    }
    failed: Counter[str] = Counter()
    for run in runs:
        failed.update(run.failed)
    return Summary(
        policy=runs[0].policy,
        trace=trace,
        seeds=[run.seed for run in runs],
        u100=[c.unallocated[100] for c in per_run],
        curve=curve,
        frag_amount=_mean_at([c.frag_amount for c in per_run], 100) or 0.0,
        frag_ratio=_mean_at([c.frag_ratio for c in per_run], 100) or 0.0,
        failed_by_type={k: round(v / len(runs), 1) for k, v in sorted(failed.items())},
        seconds_per_seed=statistics.fmean(run.seconds for run in runs),
    )


def published_u100(results_dir: Path, trace: str, policy: str) -> dict[int, float]:
    """Per seed, the published U(100) of `policy` on `trace` (empty when not published)."""
    name = PUBLISHED_NAMES.get(policy)
    path = results_dir / "analysis_allo_discrete.csv"
    if name is None or not path.exists():
        return {}
    found = {}
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            if row["workload"] == trace and row["sc_policy"] == name and row.get("100"):
                found[int(row["seed"])] = round(100 - float(row["100"]), 2)
    return found


def plot(summaries: list[Summary], path: Path) -> None:
    """U(x) of several policies on one chart, as in the paper's Fig. 9(a)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.5))
    xs = list(CURVE_X)
    axes.plot(xs, [max(0, 100 - x) for x in xs], "k:", label="ideal")
    for summary in summaries:
        points = sorted(summary.curve.items())
        axes.plot([x for x, _ in points], [u for _, u in points], label=summary.policy)
    axes.set_xlabel("arrived workload, % of GPU capacity")
    axes.set_ylabel("unallocated GPU %")
    seeds = summaries[0].seeds
    axes.set_title(f"{summaries[0].trace}: mean over seeds {seeds[0]}-{seeds[-1]}")
    axes.set_ylim(0, 30)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)

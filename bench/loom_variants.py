"""The variants of FGD tried on the way to `loom`, on the Alibaba trace (EVALUATION.md protocol).

Each variant is FGD's fragmentation gradient Δ with one change in how nodes are
compared; U(100) (unallocated GPU % when 100% of capacity has arrived) is the
mean over the seeds. docs/benchmarks.md records the output.

  python bench/loom_variants.py [--seeds 42-44] [--trace default]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

from gpuloom.placement.engine import Context
from gpuloom.placement.fragmentation import Workload
from gpuloom.placement.policies import FGD, Loom, MemoisedDelta
from gpuloom.placement.resources import NodeView, Request
from gpuloom.sim.metrics import curves
from gpuloom.sim.replay import replay
from gpuloom.sim.trace import load_nodes, load_tasks, typical_workload

TRACE_DIR = Path(__file__).resolve().parents[2] / "shared/traces/alibaba-gpu-v2023"

Score = Callable[[int, float, NodeView, Request], int]


class Variant(MemoisedDelta):
    """Δ (numerator) and Δ in milli-GPU go to `rule`, which returns the integer score."""

    def __init__(self, name: str, rule: Score) -> None:
        super().__init__()
        self.name = name
        self.rule = rule

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        delta = self.delta(node, request, context)
        return self.rule(delta, delta / self.meter(context).total, node, request)


def bucket(milli: float, temperature: float = 1000.0, steps: int = 100) -> int:
    return math.floor(steps / (1 + math.exp(milli / temperature)))


def left(node: NodeView, request: Request) -> int:
    return node.gpu_milli_free - request.gpu_demand_milli


VARIANTS: dict[str, Score] = {
    "exact Δ, then rank": lambda d, m, n, r: -d,
    "bucket, then best fit": lambda d, m, n, r: bucket(m) * 10**6 - left(n, r),
    "bucket, then worst fit": lambda d, m, n, r: bucket(m) * 10**6 + left(n, r),
    "bucket T=500, then rank": lambda d, m, n, r: bucket(m, 500.0),
    "bucket T=2000, then rank": lambda d, m, n, r: bucket(m, 2000.0),
    "bucket T=4000, then rank": lambda d, m, n, r: bucket(m, 4000.0),
    "50 buckets, then used node": lambda d, m, n, r: (
        bucket(m, steps=50) * 2 + any(not g.idle for g in n.gpus)
    ),
    "200 buckets, then used node": lambda d, m, n, r: (
        bucket(m, steps=200) * 2 + any(not g.idle for g in n.gpus)
    ),
}


def reweighted(workload: Workload, how: str) -> Workload:
    shapes = []
    for shape, weight in workload.shapes:
        demand = shape.gpus * shape.gpu_milli
        if how == "demand":
            shapes.append((shape, weight * max(demand, 100)))
        elif how == "no-cpu-only" and shape.gpus:
            shapes.append((shape, weight))
    return Workload(tuple(shapes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--seeds", default="42-44")
    parser.add_argument("--trace", default="default")
    args = parser.parse_args()
    low, high = (int(x) for x in args.seeds.split("-"))
    seeds = range(low, high + 1)
    nodes = load_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv")
    tasks = load_tasks(TRACE_DIR / f"openb_pod_list_{args.trace}.csv")
    workload = typical_workload(tasks)
    runs: list[tuple[str, object, Workload]] = [
        ("fgd (published scoring)", FGD(), workload),
        ("loom (bucket, then used node)", Loom(), workload),
    ]
    runs += [(name, Variant(name, rule), workload) for name, rule in VARIANTS.items()]
    runs += [
        ("fgd, workload weighted by GPU demand", FGD(), reweighted(workload, "demand")),
        ("fgd, workload without CPU-only shapes", FGD(), reweighted(workload, "no-cpu-only")),
    ]
    print(f"trace {args.trace}, seeds {low}-{high}: U(100) mean (per seed)")
    for name, policy, used in runs:
        values = [
            curves(replay(nodes, tasks, policy, seed, used)).unallocated[100]  # type: ignore[arg-type]
            for seed in seeds
        ]
        print(f"  {name:40s} {statistics.fmean(values):5.2f}  {values}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

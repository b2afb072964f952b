"""The variants of FGD tried on the way to `loom`, on the Alibaba trace (EVALUATION.md protocol).

Each variant is FGD's fragmentation gradient Δ with one change in how nodes are
compared; U(100) (unallocated GPU % when 100% of capacity has arrived) is the
mean over the seeds. docs/benchmarks.md records the output.

  python bench/loom_variants.py [--seeds 42-44] [--trace default] [--only loom]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
from collections import Counter
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

from gpuloom.placement.engine import Context
from gpuloom.placement.fragmentation import Workload
from gpuloom.placement.policies import FGD, Loom, MemoisedDelta
from gpuloom.placement.resources import NodeView, Request
from gpuloom.placement.scarcity import SCARCE_PRESSURE, scarce_models
from gpuloom.sim.metrics import curves
from gpuloom.sim.replay import replay
from gpuloom.sim.trace import TraceNode, load_nodes, load_tasks, typical_workload

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


def used(node: NodeView) -> bool:
    return any(not g.idle for g in node.gpus)


def loom_then(node: NodeView, milli: float, steps: int, second: int) -> int:
    """loom's order (bucket, then a used node), then `second` (0 <= second < steps)."""
    return (bucket(milli) * 2 + used(node)) * steps + second


def informed_variants(nodes: list[TraceNode], workload: Workload) -> dict[str, Score]:
    """Third keys after loom's two, tried on 2026-12-05 (issue #15, item 4). They read the
    nodes' sizes (static) or the workload's CPU per GPU, so they are built per trace."""
    size = {node.name: node for node in nodes}
    gpu_weight = sum(w * s.gpus * s.gpu_milli for s, w in workload.shapes)
    cpu_per_gpu = sum(w * s.cpu_milli for s, w in workload.shapes) / max(gpu_weight, 1)

    def balance(node: NodeView, request: Request) -> int:
        """Leftover CPU against the workload's CPU per GPU times leftover GPU (closer: more)."""
        cpu = (node.cpu_free_milli or 0) - request.cpu_milli
        return 10**6 - min(int(abs(cpu - cpu_per_gpu * left(node, request))), 10**6)

    def ratio_match(node: NodeView, request: Request) -> int:
        """How close the node's CPU per GPU (its size) is to the task's, in octaves."""
        spec = size[node.name]
        mine = spec.cpu_milli / max(spec.gpus * 1000, 1)
        theirs = request.cpu_milli / max(request.gpu_demand_milli, 100)
        return 8 - min(int(abs(math.log2(max(theirs, 1e-3) / max(mine, 1e-3)))), 8)

    def idle_gpus(node: NodeView) -> int:
        return sum(1 for g in node.gpus if g.idle)

    def partly_used(node: NodeView) -> bool:
        return any(0 < g.milli_free < 1000 for g in node.gpus)

    return {
        **scarcity_variants(nodes, workload),
        "loom, then fewest idle GPUs": lambda d, m, n, r: loom_then(n, m, 9, 8 - idle_gpus(n)),
        "loom, a fraction to a partly used GPU's node": lambda d, m, n, r: (
            bucket(m) * 2 + (partly_used(n) if r.fractional else used(n))
        ),
        "loom, then CPU:GPU left as the workload's": lambda d, m, n, r: loom_then(
            n, m, 10**6 + 1, balance(n, r)
        ),
        "loom, then node CPU per GPU as the task's": lambda d, m, n, r: loom_then(
            n, m, 9, ratio_match(n, r)
        ),
        "loom, then smaller nodes for small tasks": lambda d, m, n, r: loom_then(
            n, m, 17, 8 - size[n.name].gpus if r.gpu_demand_milli < 8000 else size[n.name].gpus
        ),
        "loom, then nodes with more CPU": lambda d, m, n, r: loom_then(
            n, m, 64, min(size[n.name].cpu_milli // 16_000, 63)
        ),
    }


def scarcity_variants(nodes: list[TraceNode], workload: Workload) -> dict[str, Score]:
    """loom v3's rule at other pressures, and applied to CPU-only tasks too (issue #15,
    item 4, 2026-12-05): run with --trace gpuspec10 (20, 25, 33)."""
    supply = Counter(node.model for node in nodes for _ in range(node.gpus))

    def leaving(pressure: Fraction, cpu_only_too: bool) -> Score:
        scarce = scarce_models(workload, supply, pressure)

        def rule(d: int, m: float, n: NodeView, r: Request) -> int:
            free_to_roam = (r.gpus > 0 or cpu_only_too) and not r.models
            on_scarce = any(g.model in scarce for g in n.gpus)
            return bucket(m) * 2 + (used(n) and not (free_to_roam and on_scarce))

        return rule

    return {
        "loom v3 rule, pressure above 0.2": leaving(Fraction(2, 10), False),
        "loom v3 rule, pressure above 0.5": leaving(Fraction(5, 10), False),
        "loom v3 rule, CPU-only tasks too": leaving(SCARCE_PRESSURE, True),
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
    parser.add_argument("--only", default="", help="run the variants whose name contains this")
    args = parser.parse_args()
    low, high = (int(x) for x in args.seeds.split("-"))
    seeds = range(low, high + 1)
    nodes = load_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv")
    tasks = load_tasks(TRACE_DIR / f"openb_pod_list_{args.trace}.csv")
    workload = typical_workload(tasks, nodes)
    runs: list[tuple[str, object, Workload]] = [
        ("fgd (published scoring)", FGD(), workload),
        ("loom v3 (bucket, then used node)", Loom.version_3(), workload),
        ("loom v2 (scarce models not left)", Loom.version_2(), workload),
        ("loom v4 (gaps valued)", Loom.version_4(), workload),
        ("loom v5 (CPU stranding counted)", Loom(), workload),
    ]
    rules = {**VARIANTS, **informed_variants(nodes, workload)}
    runs += [(name, Variant(name, rule), workload) for name, rule in rules.items()]
    runs += [
        ("fgd, workload weighted by GPU demand", FGD(), reweighted(workload, "demand")),
        ("fgd, workload without CPU-only shapes", FGD(), reweighted(workload, "no-cpu-only")),
    ]
    print(f"trace {args.trace}, seeds {low}-{high}: U(100) mean (per seed)")
    for name, policy, used_workload in runs:
        if args.only not in name:
            continue
        values = [
            curves(replay(nodes, tasks, policy, seed, used_workload)).unallocated[100]  # type: ignore[arg-type]
            for seed in seeds
        ]
        print(f"  {name:40s} {statistics.fmean(values):5.2f}  {values}", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()

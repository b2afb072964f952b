"""gpuloom's policies against the published FGD results on the Alibaba trace and its variants.

Runs `gpuloom sim`'s replay (the published protocol, EVALUATION.md §2) for each
trace and policy over seeds 42-51 and prints Markdown tables: U(100) mean ± sd
beside the published mean, U(120) for the gpuspec traces, and seconds per seed.
Writes every summary as JSON lines to `--out` so tables can be re-made.

  python bench/trace_compare.py --policies fgd,loom --traces default,gpushare40,...
  python bench/trace_compare.py --policies bestfit,dotprod,pack,random,fgd,loom --traces default
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpuloom.placement.policies import shipped_policies
from gpuloom.sim.replay import replay
from gpuloom.sim.report import published_u100, summarize
from gpuloom.sim.trace import load_nodes, load_tasks, typical_workload

TRACE_DIR = Path(__file__).resolve().parents[2] / "shared/traces/alibaba-gpu-v2023"
VARIANTS = [
    "default",
    "gpushare40", "gpushare60", "gpushare80", "gpushare100",
    "multigpu20", "multigpu30", "multigpu40", "multigpu50",
    "gpuspec10", "gpuspec20", "gpuspec25", "gpuspec33",
    "cpu050", "cpu100", "cpu200", "cpu250",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--policies", default="fgd,loom")
    parser.add_argument("--traces", default=",".join(VARIANTS))
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    low, high = (int(x) for x in args.seeds.split("-"))
    seeds = list(range(low, high + 1))
    known = {p.name: p for p in shipped_policies()}
    nodes = load_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv")
    lines: list[str] = []
    print("| trace | policy | U(100) mean ± sd | published mean | U(120) | s/seed |")
    print("| --- | --- | --- | --- | --- | --- |")
    for trace in args.traces.split(","):
        name = f"openb_pod_list_{trace}"
        tasks = load_tasks(TRACE_DIR / f"{name}.csv")
        workload = typical_workload(tasks, nodes)
        for policy in args.policies.split(","):
            runs = [replay(nodes, tasks, known[policy], seed, workload) for seed in seeds]
            summary = summarize(name, runs)
            published = published_u100(TRACE_DIR / "fgd-published-results", name, policy)
            pub = f"{sum(published.values()) / len(published):.2f}" if published else "-"
            print(
                f"| {trace} | {policy} | {summary.u100_mean:.2f} ± {summary.u100_sd:.2f} | {pub} "
                f"| {summary.curve.get(120, float('nan')):.2f} | {summary.seconds_per_seed:.1f} |",
                flush=True,
            )
            lines.append(json.dumps(summary.as_json()))
    if args.out:
        with Path(args.out).open("a") as out:
            out.write("".join(line + "\n" for line in lines))


if __name__ == "__main__":
    main()

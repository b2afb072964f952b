"""Where the unallocated GPU share is when arrivals reach 100% of capacity.

U(100) is the GPU share free at that moment (EVALUATION.md §2.6). This splits it, per
policy, mean over seeds, in % of capacity:

- gaps: the free share of GPUs partly in use;
- idle, CPU-short: whole free GPUs on nodes whose free CPU or host memory no one-GPU
  task of the trace fits (they stay idle whatever comes next);
- idle: the other whole free GPUs.

  python bench/loom_leftover.py [--trace default] [--seeds 42-51] [--policies fgd,loom-v4,loom]
"""

from __future__ import annotations

import argparse
import statistics
from concurrent.futures import ProcessPoolExecutor

from loom_paired import TRACE_DIR, policy_named

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.sim.replay import cluster_when_arrived
from gpuloom.sim.trace import load_nodes, load_tasks, typical_workload


def leftover(job: tuple[str, str, int]) -> tuple[float, float, float]:
    trace, name, seed = job
    nodes = load_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv")
    tasks = load_tasks(TRACE_DIR / f"openb_pod_list_{trace}.csv")
    capacity = sum(n.gpus for n in nodes) * MILLI_PER_GPU
    workload = typical_workload(tasks, nodes)
    index = cluster_when_arrived(nodes, tasks, policy_named(name), seed, workload, capacity)
    one_gpu = {
        (t.cpu_milli, t.memory_mib) for t in tasks if t.gpus == 1 and t.gpu_milli == MILLI_PER_GPU
    }
    gaps = short = idle = 0
    for node in index.nodes.values():
        cpu, memory = node.cpu_free_milli or 0, node.memory_free_mib or 0
        hosts_one = any(c <= cpu and m <= memory for c, m in one_gpu)
        for gpu in node.gpus:
            if gpu.milli_free < MILLI_PER_GPU:
                gaps += gpu.milli_free
            elif hosts_one:
                idle += MILLI_PER_GPU
            else:
                short += MILLI_PER_GPU
    return gaps * 100 / capacity, short * 100 / capacity, idle * 100 / capacity


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default="default")
    parser.add_argument("--seeds", default="42-51")
    parser.add_argument("--policies", default="fgd,loom-v4,loom")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    low, high = (int(x) for x in args.seeds.split("-"))
    seeds = range(low, high + 1)
    names = args.policies.split(",")
    jobs = [(args.trace, name, seed) for name in names for seed in seeds]
    with ProcessPoolExecutor(args.workers) as pool:
        results = dict(zip(jobs, pool.map(leftover, jobs), strict=True))
    print(f"trace {args.trace}, seeds {low}-{high}, arrived 100%: free GPU share, % of capacity")
    print(f"  {'policy':10s} {'gaps':>6s} {'idle, CPU-short':>16s} {'idle':>6s} {'total':>6s}")
    for name in names:
        parts = [results[(args.trace, name, seed)] for seed in seeds]
        gaps, short, idle = (statistics.fmean(p[i] for p in parts) for i in range(3))
        print(f"  {name:10s} {gaps:6.2f} {short:16.2f} {idle:6.2f} {gaps + short + idle:6.2f}")


if __name__ == "__main__":
    main()

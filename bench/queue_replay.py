"""FIFO vs priority vs priority with EASY backfill, on the Alibaba openb trace.

Replays `openb_pod_list_default.csv` (creation time = arrival, deletion minus
creation = runtime, time limit = runtime rounded up to the minute, QoS = priority
class: LS and Guaranteed 2, Burstable 1, BE 0) against every third node of the
trace's cluster, through the live scheduling pass (`gpuloom.placement.scheduling`)
with the bestfit policy. Arrival times are divided by `--compress` (runtimes are
not): at the trace's own pace its jobs fill under 1% of even a third of the
cluster and nobody ever waits; at 1000x the peak demand is 1.3x the capacity.

Prints, per mode, mean and p95 queue wait (seconds of simulated time), the p95
wait of the highest priority class, the share of jobs started by backfill and
GPU utilisation over the busy period (from the 10th-percentile arrival to the last
arrival, when 90% of the jobs arrive): its mean and ten equal slices.

  python bench/queue_replay.py [--compress 1000] [--depth 500] [--json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpuloom.placement.registry import default_registry
from gpuloom.sim.queue_sim import MODES, load_timed_tasks, simulate, third_of
from gpuloom.sim.trace import load_nodes

TRACE_DIR = Path(__file__).resolve().parents[2] / "shared/traces/alibaba-gpu-v2023"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trace", default="default")
    parser.add_argument("--compress", type=int, default=1000)
    parser.add_argument("--policy", default="bestfit")
    parser.add_argument("--depth", type=int, default=500, help="backfill depth (bf_max_job_test)")
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    nodes = third_of(load_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv"))
    tasks = load_timed_tasks(TRACE_DIR / f"openb_pod_list_{args.trace}.csv", args.compress)
    policy = default_registry().get(args.policy)
    arrivals = sorted(task.arrival_s for task in tasks)
    # the busy period: from the 10th-percentile arrival to the last (90% of the jobs)
    window = (arrivals[len(arrivals) // 10], arrivals[-1])
    top = max(task.priority_class for task in tasks)
    print(
        f"trace {args.trace}: {len(tasks)} jobs, arrivals compressed {args.compress}x over "
        f"{arrivals[-1] - arrivals[0]} s (busy period {window[1] - window[0]} s); "
        f"cluster {len(nodes)} nodes, "
        f"{sum(n.gpus for n in nodes)} GPUs (a third); policy {args.policy}; "
        f"backfill depth {args.depth}"
    )
    print()
    print(
        "| mode | mean wait s | p95 wait s | p95 wait, class "
        f"{top} s | backfilled | GPU util. (busy period) | run s |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    series = {}
    results = []
    for mode in args.modes.split(","):
        run = simulate(nodes, tasks, policy, mode, backfill_depth=args.depth)
        top_waits = run.waits_by_class.get(top, [])
        row = {
            "mode": mode,
            "jobs": run.jobs,
            "never_fit": run.never_fit,
            "mean_wait_s": round(run.mean_wait(), 1),
            "p95_wait_s": run.p95_wait(),
            "top_class_p95_wait_s": run.p95_wait(top_waits),
            "top_class_mean_wait_s": round(run.mean_wait(top_waits), 1),
            "backfilled_share": round(run.backfilled / run.jobs, 4) if run.jobs else 0.0,
            "utilisation": round(run.utilisation(*window), 4),
            "utilisation_series": [round(u, 3) for u in run.utilisation_series(*window)],
            "passes": run.passes,
            "seconds": round(run.seconds, 1),
        }
        results.append(row)
        series[mode] = row["utilisation_series"]
        print(
            f"| {mode} | {row['mean_wait_s']:.0f} | {row['p95_wait_s']:.0f} | "
            f"{row['top_class_p95_wait_s']:.0f} | {100 * row['backfilled_share']:.1f}% | "
            f"{100 * row['utilisation']:.1f}% | {row['seconds']:.0f} |",
            flush=True,
        )
    print()
    print("GPU utilisation over the busy period, ten equal slices:")
    for mode, values in series.items():
        print(f"  {mode:18} " + " ".join(f"{100 * v:5.1f}%" for v in values))
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""The openb trace's replay with a topology, beside the same replay without (#38 item 6).

`bench/queue_replay.py`'s replay (the default trace, arrivals compressed `--compress`
times, every third node of the trace's cluster, bestfit, each arrival and end one pass
of the live scheduling pass) with a topology (`gpuloom.sim.domains`): the nodes in name
order, `--rack-nodes` to a rack, each node its own NVLink domain; every multi-GPU task
becomes a gang of replicas of `--replica-gpus` GPUs (the trace's multi-GPU pods hold
all their GPUs on one node, which any topology holds trivially), asking

- `none`: no topology (the same gangs, free to span racks);
- `preferred`: `{"level": "<--level>", "mode": "preferred"}`;
- `required`: `{"level": "<--level>", "mode": "required"}`;
- `pods` (not by default): the trace's tasks as they are, no gangs, no topology.

Prints, per queue mode and topology: the share of gangs inside one rack and on one node,
the wait of the large gangs (at least `--large-gpus` GPUs in all; with `pods`, the
large pods; mean and p95, seconds of simulated time), every job's mean wait, and GPU utilisation over the busy period (from
the 10th-percentile arrival to the last, as queue_replay).

  python bench/topology_trace.py [--modes fifo,priority+backfill] [--asks none,preferred,required]
      [--rack-nodes 8] [--replica-gpus 1] [--level rack] [--compress 1000] [--large-gpus 8]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gpuloom.placement.registry import default_registry
from gpuloom.sim.domains import Mode, as_gang, figures, is_gang, racks
from gpuloom.sim.queue_sim import load_timed_tasks, simulate, third_of
from gpuloom.sim.trace import load_nodes

TRACE_DIR = Path(__file__).resolve().parents[2] / "shared/traces/alibaba-gpu-v2023"
ASKS: dict[str, Mode | None] = {"none": None, "preferred": "preferred", "required": "required"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trace", default="default")
    parser.add_argument("--compress", type=int, default=1000)
    parser.add_argument("--policy", default="bestfit")
    parser.add_argument("--modes", default="fifo,priority+backfill")
    parser.add_argument("--asks", default="none,preferred,required")
    parser.add_argument("--rack-nodes", type=int, default=8)
    parser.add_argument("--replica-gpus", type=int, default=1)
    parser.add_argument("--level", default="rack", choices=["nvlink", "rack"])
    parser.add_argument("--large-gpus", type=int, default=8)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    nodes = third_of(load_nodes(TRACE_DIR / "openb_node_list_gpu_node.csv"))
    trace = load_timed_tasks(TRACE_DIR / f"openb_pod_list_{args.trace}.csv", args.compress)
    places = racks(nodes, args.rack_nodes)
    policy = default_registry().get(args.policy)
    arrivals = sorted(task.arrival_s for task in trace)
    window = (arrivals[len(arrivals) // 10], arrivals[-1])
    multi = [t for t in trace if t.task.gpus > 1]
    gangs = sum(1 for t in multi if is_gang(as_gang(t, args.replica_gpus, None)))
    print(
        f"trace {args.trace}: {len(trace)} jobs, {len(multi)} of them multi-GPU "
        f"({sum(1 for t in multi if t.task.gpus >= args.large_gpus)} of at least "
        f"{args.large_gpus} GPUs), {gangs} as gangs of {args.replica_gpus}-GPU replicas; arrivals "
        f"compressed {args.compress}x; {len(nodes)} nodes, {sum(n.gpus for n in nodes)} "
        f"GPUs, {len(set(p['rack'] for p in places.values()))} racks of {args.rack_nodes} "
        f"nodes; policy {args.policy}; topology level {args.level}"
    )
    print()
    print(
        "| mode | topology | gangs in one rack | on one node | large gangs: mean / p95 wait s "
        "| every job: mean wait s | GPU util. (busy period) | run s |"
    )
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    results = []
    for mode in args.modes.split(","):
        for ask in args.asks.split(","):
            if ask == "pods":
                tasks = trace
            else:
                asked = ASKS[ask]
                wanted = None if asked is None else (args.level, asked)
                tasks = [as_gang(t, args.replica_gpus, wanted) for t in trace]
            run = simulate(nodes, tasks, policy, mode, places=places)
            found = figures(run, tasks, places, args.large_gpus, window)
            result = {
                "mode": mode,
                "topology": ask,
                "gangs": found.gangs,
                "started_gangs": found.started_gangs,
                "in_one_rack": round(found.share_inside("rack"), 4),
                "on_one_node": round(found.share_inside("nvlink"), 4),
                "large_gangs": found.large,
                "large_mean_wait_s": round(found.large_mean_wait, 1),
                "large_p95_wait_s": found.large_p95_wait,
                "mean_wait_s": round(run.mean_wait(), 1),
                "never_fit": run.never_fit,
                "utilisation": round(found.utilisation, 4),
                "seconds": round(run.seconds, 1),
            }
            results.append(result)
            share = "-" if ask == "pods" else f"{found.share_inside('rack'):.0%}"
            node = "-" if ask == "pods" else f"{found.share_inside('nvlink'):.0%}"
            print(
                f"| {mode} | {ask} | {share} | {node} | {found.large_mean_wait:.0f} / "
                f"{found.large_p95_wait:.0f} | {run.mean_wait():.0f} | "
                f"{found.utilisation:.1%} | {run.seconds:.0f} |",
                flush=True,
            )
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()

"""Whole-rack gangs in a stream of small jobs, through the scheduling pass (#38 item 3).

A seeded stream (`gpuloom.sim.rack_stream`) on 8 racks of 4 nodes of 8 GPUs: small
jobs of 1 to 4 GPUs, 70% short (1 to 30 min) and 30% long (1 to 4 h), and, one job in
33, a whole-rack gang (4 replicas of 8 GPUs, 30 min to 2 h) asking
`"topology": {"level": "rack", "mode": "required"}`. One job every `--gap` seconds on
average; time limits are the runtimes rounded up to the minute. Each arrival and end
runs one pass of the live scheduling pass (`gpuloom.placement.scheduling.schedule`),
in simulated time (`gpuloom.sim.queue_sim`), in four ways:

- `easy`: gpuloom as built, EASY backfill: the first blocked job reserves what it
  needs at its earliest start, and jobs that would outlast that start keep off it;
- `greedy`: the control without reservations: every job that fits starts, in arrival
  order, so small jobs may take what a waiting gang needs;
- `fifo`: backfill off: nothing passes a blocked job;
- `easy, no topology`: EASY with the same gangs free to span racks.

Prints, per policy and way: the whole-rack gangs' wait (mean, p95, max; and the mean
of those arriving in the first and in the last third of the stream, which grows when
gangs are starved), the small jobs' wait (mean, p95), the share of jobs started by
backfill, GPU utilisation from the first arrival to the last, and the share of gangs
inside one rack. For `easy`, also whether every job that held a reservation started no
later than the first start it was promised, and the longest time a gang waited once it
held the reservation (against the longest time limit in the stream). Waits in minutes
of simulated time.

  python bench/topology_replay.py [--jobs 3000] [--gap 60] [--seed 7] [--policies bestfit,spread]
"""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

from gpuloom.placement.outcomes import Outcome, Reserved
from gpuloom.placement.registry import default_registry
from gpuloom.sim.domains import in_one_domain
from gpuloom.sim.queue_sim import GREEDY, QueueRun, TimedTask, simulate
from gpuloom.sim.rack_stream import Shape, rack_cluster, stream, whole_rack

WAYS = {
    "easy": ("priority+backfill", True),
    "greedy": (GREEDY, True),
    "fifo": ("fifo", True),
    "easy, no topology": ("priority+backfill", False),
}


class FirstReserved:
    """Job -> (when it first held the reservation, the start it was promised then), s."""

    def __init__(self) -> None:
        self.first: dict[int, tuple[int, int]] = {}

    def __call__(self, now: int, outcomes: list[Outcome]) -> None:
        for outcome in outcomes:
            if isinstance(outcome, Reserved) and outcome.reservation.start_at is not None:
                job = int(outcome.reservation.job_id)
                self.first.setdefault(job, (now, outcome.reservation.start_at // 1000))


def minutes(values: list[int]) -> tuple[float, float, float]:
    """Mean, p95 and max of `values` (seconds), in minutes."""
    if not values:
        return (0.0, 0.0, 0.0)
    ordered = sorted(values)
    p95 = ordered[max(0, math.ceil(0.95 * len(ordered)) - 1)]
    return (sum(values) / len(values) / 60, p95 / 60, ordered[-1] / 60)


def row(
    way: str, run: QueueRun, tasks: list[TimedTask], shape: Shape, places: dict[str, dict[str, str]]
) -> str:
    gangs = [n for n, t in enumerate(tasks) if whole_rack(t, shape)]
    small = sorted(set(range(len(tasks))) - set(gangs))
    third = len(gangs) // 3
    early, late = gangs[:third], gangs[-third:] if third else []
    waits = [run.wait_of[n] for n in gangs if n in run.wait_of]
    inside = sum(
        1 for n in gangs if n in run.nodes_of and in_one_domain(run.nodes_of[n], places, "rack")
    )
    g_mean, g_p95, g_max = minutes(waits)
    s_mean, s_p95, _ = minutes([run.wait_of[n] for n in small if n in run.wait_of])
    e_mean = minutes([run.wait_of[n] for n in early])[0]
    l_mean = minutes([run.wait_of[n] for n in late])[0]
    end = max(t.arrival_s for t in tasks)
    return (
        f"| {way} | {g_mean:.0f} / {g_p95:.0f} / {g_max:.0f} | {e_mean:.0f} / {l_mean:.0f} | "
        f"{s_mean:.1f} / {s_p95:.0f} | {run.backfilled / run.jobs:.0%} | "
        f"{run.utilisation(0, end):.1%} | {inside}/{len(gangs)} | {run.seconds:.0f} |"
    )


def promises(watch: FirstReserved, run: QueueRun, tasks: list[TimedTask], shape: Shape) -> str:
    kept = sum(
        1
        for job, (_, start) in watch.first.items()
        if tasks[job].arrival_s + run.wait_of[job] <= start
    )
    as_head = [
        tasks[job].arrival_s + run.wait_of[job] - held
        for job, (held, _) in watch.first.items()
        if whole_rack(tasks[job], shape)
    ]
    longest_limit = max(t.time_limit_s for t in tasks)
    return (
        f"  easy: {kept} of the {len(watch.first)} jobs that held a reservation started no "
        f"later than first promised; once holding it, a gang waited at most "
        f"{max(as_head, default=0) / 60:.0f} min (longest time limit {longest_limit / 60:.0f} min)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--gap", type=int, default=60, help="mean seconds between arrivals")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--policies", default="bestfit,spread")
    args = parser.parse_args()
    base = Shape(jobs=args.jobs, mean_gap_s=args.gap)
    nodes, places = rack_cluster(base)
    tasks = stream(base, args.seed)
    gangs = sum(1 for t in tasks if whole_rack(t, base))
    print(
        f"{base.racks} racks x {base.nodes_per_rack} nodes x {base.gpus_per_node} GPUs; "
        f"{len(tasks)} jobs over {tasks[-1].arrival_s / 3600:.1f} h, {gangs} of them whole-rack "
        f"gangs ({base.nodes_per_rack} x {base.gpus_per_node} GPUs, rack required); seed "
        f"{args.seed}; waits in minutes"
    )
    registry = default_registry()
    for name in args.policies.split(","):
        policy = registry.get(name)
        print()
        print(f"policy {name}:")
        print()
        print(
            "| way | whole-rack gangs: mean / p95 / max wait | first / last third mean | "
            "small: mean / p95 wait | backfilled | GPU util. | gangs in one rack | run s |"
        )
        print("|---|---:|---:|---:|---:|---:|---:|---:|")
        notes = []
        for way, (mode, topology) in WAYS.items():
            shape = base if topology else replace(base, gang_ask=None)
            jobs = tasks if topology else stream(shape, args.seed)
            watch = FirstReserved()
            run = simulate(nodes, jobs, policy, mode, places=places, observe=watch)
            print(row(way, run, jobs, shape, places), flush=True)
            if way == "easy":
                notes.append(promises(watch, run, jobs, shape))
        print()
        print(*notes, sep="\n")


if __name__ == "__main__":
    main()

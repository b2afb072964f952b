"""Which domain a required-topology gang goes to, and what it costs the big gangs.

`gpuloom.placement.topology` puts a gang that must be inside one rack into the fitting
rack with the fewest GPUs that could serve it (the tightest), so that the emptiest racks
stay whole for gangs that need a whole rack. This replays one seeded stream of gangs,
all asking `"topology": {"level": "rack", "mode": "required"}`, on 8 racks of 4 nodes of
8 GPUs, through the engine's `place` (greedy: every waiting job is tried at every step,
oldest first), with three ways to choose among fitting racks:

- `tightest`: gpuloom's (fewest serving GPUs first, then the name);
- `first`: the first fitting rack by name (what a plain loop over domains does);
- `roomiest`: the most serving GPUs first (spreading the load).

Prints, per choice: the mean and p95 wait of whole-rack gangs (4 x 8 GPUs) and of the
small ones (1 or 2 x 4 GPUs), in steps, and the GPUs' mean utilisation.

  python bench/topology_domains.py [--jobs 3000] [--seed 7] [--gap 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
from collections.abc import Callable

from gpuloom.placement import BestFit, Context, NodeIndex
from gpuloom.placement import topology as topology_module
from gpuloom.placement.engine import release
from gpuloom.placement.resources import GpuView, NodeView, Placement, Request

RACKS, NODES_PER_RACK, GPUS_PER_NODE = 8, 4, 8


def cluster() -> NodeIndex:
    views = []
    for rack in range(RACKS):
        for number in range(NODES_PER_RACK):
            name = f"r{rack}n{number}"
            gpus = [
                GpuView(i, f"{name}-{i}", "A100", "physical", 81920) for i in range(GPUS_PER_NODE)
            ]
            views.append(
                NodeView(
                    name=name,
                    rank=len(views),
                    gpus=gpus,
                    topology={"nvlink": name, "rack": f"r{rack}"},
                )
            )
    return NodeIndex(views)


def stream(jobs: int, seed: int, gap: int) -> list[tuple[int, Request, int, bool]]:
    """(arrival step, request, duration in steps, whole rack) for each job; one arrives
    every `gap` steps on average."""
    rng = random.Random(seed)
    found = []
    step = 0
    for _ in range(jobs):
        step += rng.randint(0, 2 * gap)
        big = rng.random() < 0.15
        replicas = 4 if big else rng.choice((1, 2))
        gpus = 8 if big else 4
        request = Request(gpus=gpus, replicas=replicas, topology=("rack", "required"))
        found.append((step, request, rng.randint(5, 40), big))
    return found


def replay(jobs: list[tuple[int, Request, int, bool]]) -> dict[str, float]:
    index, policy = cluster(), BestFit()
    total = RACKS * NODES_PER_RACK * GPUS_PER_NODE
    waiting: list[tuple[int, int]] = []  # (arrival step, job number)
    running: list[tuple[int, Placement]] = []  # (end step, placement)
    waits: dict[bool, list[int]] = {True: [], False: []}
    busy_sum, steps, step, next_job = 0, 0, 0, 0
    while next_job < len(jobs) or waiting or running:
        for _, placement in [r for r in running if r[0] <= step]:
            for replica in placement.replicas:
                release(index, replica)
        running = [r for r in running if r[0] > step]
        while next_job < len(jobs) and jobs[next_job][0] <= step:
            waiting.append((jobs[next_job][0], next_job))
            next_job += 1
        still = []
        for arrived, number in waiting:
            _, request, duration, big = jobs[number]
            placement = topology_module.place(request, index, policy, Context(seed=step))
            if placement is None:
                still.append((arrived, number))
                continue
            waits[big].append(step - arrived)
            running.append((step + duration, placement))
        waiting = still
        used = sum(GPUS_PER_NODE - sum(1 for g in n.gpus if g.idle) for n in index.nodes.values())
        busy_sum += used
        steps += 1
        step += 1

    def p95(values: list[int]) -> float:
        return sorted(values)[int(0.95 * (len(values) - 1))] if values else 0.0

    return {
        "big_mean": statistics.mean(waits[True]),
        "big_p95": p95(waits[True]),
        "small_mean": statistics.mean(waits[False]),
        "small_p95": p95(waits[False]),
        "util": busy_sum / (steps * total),
    }


def order_by(key: Callable[[int, str], tuple[object, ...]]) -> None:
    """Replace the engine's choice among fitting domains with `key(serving, name)`."""

    def in_one_domain(request, index, policy, context, level):  # type: ignore[no-untyped-def]
        need = request.gpus * request.replicas
        fitting = [
            (count, domain)
            for domain, nodes in topology_module.domains(index, level).items()
            if (count := topology_module.serving_count(request, nodes)) >= need
        ]
        for _, domain in sorted(fitting, key=lambda f: key(*f)):
            placement = topology_module.place_anywhere(
                topology_module.replace(request, within=(level, domain)), index, policy, context
            )
            if placement is not None:
                return placement
        return None

    topology_module._in_one_domain = in_one_domain  # type: ignore[assignment]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--gap", type=int, default=2, help="mean steps between arrivals")
    args = parser.parse_args()
    jobs = stream(args.jobs, args.seed, args.gap)
    print(
        f"{RACKS} racks x {NODES_PER_RACK} nodes x {GPUS_PER_NODE} GPUs; {len(jobs)} gangs, "
        f"{sum(1 for j in jobs if j[3])} of them whole-rack (4 x 8 GPUs), all rack-required; "
        f"one every {args.gap} steps on average; seed {args.seed}; waits in steps"
    )
    print()
    print(
        "| choice among fitting racks | whole-rack mean / p95 wait | small mean / p95 wait | GPU util. |"
    )
    print("|---|---:|---:|---:|")
    ours = topology_module._in_one_domain
    choices: dict[str, Callable[[int, str], tuple[object, ...]] | None] = {
        "tightest (gpuloom)": None,
        "first by name": lambda count, name: (name,),
        "roomiest": lambda count, name: (-count, name),
    }
    for label, key in choices.items():
        topology_module._in_one_domain = ours  # type: ignore[assignment]
        if key is not None:
            order_by(key)
        found = replay(jobs)
        print(
            f"| {label} | {found['big_mean']:.1f} / {found['big_p95']:.0f} | "
            f"{found['small_mean']:.1f} / {found['small_p95']:.0f} | {found['util']:.1%} |"
        )
    topology_module._in_one_domain = ours  # type: ignore[assignment]


if __name__ == "__main__":
    main()

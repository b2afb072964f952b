"""One what-if run: a trace, a policy, a seed -> what was allocated after every arrival.

The protocol is the published one (EVALUATION.md §2.3-2.4): name-sorted tasks
shuffled with the seed, resampled (or trimmed) to 130% of GPU capacity, nodes
ranked by a seeded permutation (the tie-break), one attempt per task, no
departures. Placement goes through the same engine and policies as the live
placement service. Python's `random.Random(seed)` replaces Go's generator, in
the same draw order (shuffle, resampling, node permutation); the statistics
are the same (§6), the exact sequences are not.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import dataclass, field

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.engine import Context, NodeIndex, Policy, place
from gpuloom.placement.fragmentation import FragmentationMeter, Workload
from gpuloom.placement.resources import Placement
from gpuloom.sim.trace import TraceNode, TraceTask

INFLATE = 1.3


@dataclass
class Run:
    """Per arrival: GPU milli arrived so far, allocated, and cluster fragmentation."""

    policy: str
    seed: int
    capacity_milli: int
    arrived: list[int] = field(default_factory=list)
    allocated: list[int] = field(default_factory=list)
    fragmentation: list[float] = field(default_factory=list)
    failed: Counter[str] = field(default_factory=Counter)
    seconds: float = 0.0


def arrival_sequence(
    tasks: list[TraceTask], capacity_milli: int, rng: random.Random
) -> list[TraceTask]:
    """Shuffle, then resample or trim to 130% of capacity (§2.3, upstream quirk included)."""
    by_name = sorted(tasks, key=lambda t: t.name)
    sequence = list(by_name)
    rng.shuffle(sequence)
    target = INFLATE * capacity_milli
    demand = sum(t.demand_milli for t in sequence)
    if demand < target:
        while True:
            task = by_name[rng.randrange(len(by_name))]
            if demand + task.gpu_milli > target:  # upstream compares the per-GPU share
                break
            sequence.append(task)
            demand += task.demand_milli
    else:
        while demand > target:
            task = sequence.pop(rng.randrange(len(sequence)))
            demand -= task.demand_milli
    return sequence


def replay(
    nodes: list[TraceNode],
    tasks: list[TraceTask],
    policy: Policy,
    seed: int,
    workload: Workload,
) -> Run:
    started = time.perf_counter()
    sequence, index = seeded_start(nodes, tasks, seed)
    meter = FragmentationMeter(workload)
    node_frag = {v.name: meter.of_node(v) for v in index.nodes.values()}
    total_frag = sum(node_frag.values())
    run = Run(policy.name, seed, sum(n.gpus for n in nodes) * MILLI_PER_GPU)
    arrived = allocated = 0
    for position, task in enumerate(sequence):
        arrived += task.demand_milli
        placement = place_arrival(task, position, index, policy, seed, workload)
        if placement is None:
            run.failed[task.kind] += 1
        else:
            allocated += task.demand_milli
            for name in {s.node for r in placement.replicas for s in r.slices} | {
                r.host for r in placement.replicas
            }:
                new = meter.of_node(index.nodes[name])
                total_frag += new - node_frag[name]
                node_frag[name] = new
        run.arrived.append(arrived)
        run.allocated.append(allocated)
        run.fragmentation.append(meter.milli(total_frag))
    run.seconds = time.perf_counter() - started
    return run


def seeded_start(
    nodes: list[TraceNode], tasks: list[TraceTask], seed: int
) -> tuple[list[TraceTask], NodeIndex]:
    """The seed's arrival sequence and the empty cluster, nodes ranked by the seed (in the
    published draw order: shuffle, resampling, node permutation)."""
    rng = random.Random(seed)
    sequence = arrival_sequence(tasks, sum(n.gpus for n in nodes) * MILLI_PER_GPU, rng)
    by_name = sorted(nodes, key=lambda n: n.name)
    ranks = list(range(len(by_name)))
    rng.shuffle(ranks)
    return sequence, NodeIndex([node.view(rank) for node, rank in zip(by_name, ranks, strict=True)])


def place_arrival(
    task: TraceTask, position: int, index: NodeIndex, policy: Policy, seed: int, workload: Workload
) -> Placement | None:
    """One attempt; a policy that is not grouped (random) draws from the arrival's position."""
    return place(task.request(), index, policy, Context(seed, position, workload))


def cluster_when_arrived(
    nodes: list[TraceNode],
    tasks: list[TraceTask],
    policy: Policy,
    seed: int,
    workload: Workload,
    arrived_milli: int,
) -> NodeIndex:
    """The cluster once the arrivals up to `arrived_milli` of GPU demand (the first that
    reaches it included) were placed or failed."""
    sequence, index = seeded_start(nodes, tasks, seed)
    arrived = 0
    for position, task in enumerate(sequence):
        place_arrival(task, position, index, policy, seed, workload)
        arrived += task.demand_milli
        if arrived >= arrived_milli:
            break
    return index

"""The what-if replay (`gpuloom.sim.replay`) on a small hand-made cluster."""

from __future__ import annotations

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.policies import FGD, Loom
from gpuloom.sim.replay import INFLATE, cluster_when_arrived, replay, seeded_start
from gpuloom.sim.trace import TraceNode, TraceTask, typical_workload

NODES = [TraceNode(f"n{i}", 32_000, 128_000, 4, "A") for i in range(3)]
TASKS = [
    TraceTask("whole", 8000, 1000, 1, 1000, ()),
    TraceTask("share", 4000, 1000, 1, 500, ()),
    TraceTask("cpu", 6000, 1000, 0, 0, ()),
    TraceTask("pair", 8000, 1000, 2, 1000, ()),
]
CAPACITY = 12 * MILLI_PER_GPU


def test_the_sequence_is_inflated_to_130_percent_and_placed_once_each() -> None:
    workload = typical_workload(TASKS, NODES)
    run = replay(NODES, TASKS, FGD(), 7, workload)
    sequence, _ = seeded_start(NODES, TASKS, 7)
    assert len(run.arrived) == len(sequence)
    assert run.arrived[-1] == sum(t.demand_milli for t in sequence)
    assert (
        INFLATE * CAPACITY - MILLI_PER_GPU < run.arrived[-1] <= INFLATE * CAPACITY + MILLI_PER_GPU
    )
    assert all(a <= b for a, b in zip(run.arrived, run.arrived[1:], strict=False))
    assert all(
        0 <= used <= min(arrived, CAPACITY)
        for used, arrived in zip(run.allocated, run.arrived, strict=True)
    )
    assert run.allocated[-1] < run.arrived[-1] and sum(run.failed.values()) > 0  # over-full
    assert replay(NODES, TASKS, FGD(), 7, workload).allocated == run.allocated  # seeded


def test_the_cluster_when_arrived_holds_what_the_replay_allocated_by_then() -> None:
    workload = typical_workload(TASKS, NODES)
    run = replay(NODES, TASKS, Loom(), 3, workload)
    for position in (0, 5, len(run.arrived) - 1):
        index = cluster_when_arrived(NODES, TASKS, Loom(), 3, workload, run.arrived[position])
        taken = sum(MILLI_PER_GPU - g.milli_free for n in index.nodes.values() for g in n.gpus)
        # the first arrival that reaches the amount is included (several may share it)
        first = run.arrived.index(run.arrived[position])
        assert taken == run.allocated[first]


def test_node_ranks_are_a_seeded_permutation_of_the_names() -> None:
    """The rank is the tie-break (EVALUATION.md §2.5): a permutation drawn by the seed."""
    orders = set()
    for seed in range(8):
        _, index = seeded_start(NODES, TASKS, seed)
        ranks = {name: view.rank for name, view in index.nodes.items()}
        assert sorted(ranks.values()) == [0, 1, 2]
        _, again = seeded_start(NODES, TASKS, seed)
        assert {name: view.rank for name, view in again.nodes.items()} == ranks
        orders.add(tuple(ranks[n.name] for n in NODES))
    assert len(orders) > 1

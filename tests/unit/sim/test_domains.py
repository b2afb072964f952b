"""Topology for the queueing what-if (`gpuloom.sim.domains`): the trace's nodes in racks,
its multi-GPU tasks as gangs asking for one, and what a run says about them."""

from __future__ import annotations

import pytest

from gpuloom.placement.policies import BestFit
from gpuloom.sim.domains import Ask, Figures, as_gang, figures, in_one_domain, racks
from gpuloom.sim.queue_sim import TimedTask, simulate
from gpuloom.sim.rack_stream import Shape, stream
from gpuloom.sim.trace import TraceNode, TraceTask


def task(name: str, gpus: int, arrival: int = 0, runtime: int = 100) -> TimedTask:
    return TimedTask(TraceTask(name, 8000, 8192, gpus, 1000 if gpus else 0, ()), arrival,
                     runtime, 0)  # fmt: skip


def test_nodes_are_grouped_into_racks_in_name_order_each_its_own_nvlink_domain() -> None:
    nodes = [TraceNode(f"n{i}", 1000, 1000, 2, "A") for i in (3, 0, 4, 1, 2)]
    places = racks(nodes, 2)
    assert places == {
        "n0": {"nvlink": "n0", "rack": "r000"},
        "n1": {"nvlink": "n1", "rack": "r000"},
        "n2": {"nvlink": "n2", "rack": "r001"},
        "n3": {"nvlink": "n3", "rack": "r001"},
        "n4": {"nvlink": "n4", "rack": "r002"},
    }
    assert list(places["n0"]) == ["nvlink", "rack"], "levels tightest first"
    with pytest.raises(ValueError):
        racks(nodes, 0)


def test_a_multi_gpu_task_becomes_a_gang_asking_the_topology_and_the_rest_stay() -> None:
    eight = as_gang(task("big", 8), 2, ("rack", "required"))
    assert eight.asks is not None
    assert (eight.asks.gpus, eight.asks.replicas) == (2, 4)
    assert (eight.asks.cpu_milli, eight.asks.memory_mib) == (2000, 2048), "split evenly"
    assert eight.asks.topology == ("rack", "required")
    assert eight.time_limit_s == task("big", 8).time_limit_s
    three = as_gang(task("odd", 3), 2, None)
    assert three.asks is not None and (three.asks.gpus, three.asks.replicas) == (2, 2)
    assert three.asks.topology is None, "the same gangs without topology"
    one, cpu = task("one", 1), task("cpu", 0)
    assert as_gang(one, 1, ("rack", "required")) is one
    assert as_gang(cpu, 1, ("rack", "required")) is cpu


def test_in_one_domain_needs_every_node_to_name_the_same_domain() -> None:
    places = {"a": {"rack": "r1"}, "b": {"rack": "r1"}, "c": {"rack": "r2"}, "d": {}}
    assert in_one_domain(["a", "b"], places, "rack")
    assert not in_one_domain(["a", "c"], places, "rack")
    assert not in_one_domain(["d"], places, "rack"), "a node without the level is in none"


NODES = [TraceNode(f"n{i}", 64_000, 256_000, 2, "A") for i in range(4)]
#: Racks interleaved by name: r0 holds n0 and n2, r1 holds n1 and n3.
PLACES = {n.name: {"nvlink": n.name, "rack": f"r{i % 2}"} for i, n in enumerate(NODES)}


@pytest.mark.parametrize(
    ("busy", "ask", "inside_rack", "gang_wait"),
    [
        (["x"], None, 0, 0),
        (["x"], ("rack", "preferred"), 1, 0),
        (["x"], ("rack", "required"), 1, 0),
        (["x", "y"], ("rack", "preferred"), 0, 0),
        (["x", "y"], ("rack", "required"), 1, 49),
    ],
    ids=[
        "r1 is free: without topology the gang spreads over both racks",
        "r1 is free: preferred, inside r1",
        "r1 is free: required, inside r1",
        "no rack has 4: preferred spreads at once",
        "no rack has 4: required waits until x ends",
    ],
)
def test_the_figures_say_where_the_gang_landed_and_how_long_it_waited(
    busy: list[str], ask: Ask | None, inside_rack: int, gang_wait: int
) -> None:
    """`x` (2 GPUs, until 50) fills n0, `y` (2 GPUs, longer) n1; then a gang of 4 x 1
    GPU arrives (a 4-GPU task as a gang)."""
    lasting = {"x": 50, "y": 500}
    tasks = [task(name, 2, 0, lasting[name]) for name in busy]
    tasks.append(as_gang(task("gang", 4, 1, 100), 1, ask))
    run = simulate(NODES, tasks, BestFit(), "priority+backfill", places=PLACES)
    found = figures(run, tasks, PLACES, large_gpus=4, window=(0, 100))
    assert (found.gangs, found.started_gangs, found.large) == (1, 1, 1)
    assert found.inside == {"nvlink": 0, "rack": inside_rack}
    assert found.large_waits == [gang_wait]
    assert found.utilisation == run.utilisation(0, 100)


def test_figures_of_no_gangs_are_zeros() -> None:
    empty = Figures(gangs=0, inside={}, started_gangs=0, large=0, large_waits=[],
                    utilisation=0.0)  # fmt: skip
    assert (empty.share_inside("rack"), empty.large_mean_wait, empty.large_p95_wait) == (0, 0, 0)
    waits = Figures(2, {"rack": 1}, 2, 2, [10, 30], 0.5)
    assert (waits.share_inside("rack"), waits.large_mean_wait, waits.large_p95_wait) == (
        0.5, 20.0, 30.0)  # fmt: skip


def test_the_stream_is_the_seed_s() -> None:
    shape = Shape(jobs=200)
    assert stream(shape, 3) == stream(shape, 3)
    assert stream(shape, 3) != stream(shape, 4)
    gangs = [t for t in stream(shape, 3) if t.asks is not None]
    assert gangs and all(t.asks is not None and t.asks.replicas == 4 for t in gangs)
    arrivals = [t.arrival_s for t in stream(shape, 3)]
    assert arrivals == sorted(arrivals)


def test_without_gangs_the_large_jobs_are_the_large_pods() -> None:
    """The trace's tasks as they are (no `as_gang`): no gang to count, and the large
    jobs are the pods of at least `large_gpus` GPUs, each on one node."""
    tasks = [task("x", 2, 0, 50), task("pod", 2, 1, 100), task("one", 1, 2, 10)]
    run = simulate(NODES, tasks, BestFit(), "priority+backfill", places=PLACES)
    found = figures(run, tasks, PLACES, large_gpus=2, window=(0, 100))
    assert (found.gangs, found.started_gangs, found.large) == (0, 0, 2)
    assert found.share_inside("rack") == 0.0
    assert found.large_waits == [0, 0]
    assert all(len(run.nodes_of[n]) == 1 for n in (0, 1)), "a pod is on one node"

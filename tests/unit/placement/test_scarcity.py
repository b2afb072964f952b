"""Scarce GPU models: the pressure of the workload's model-bound shapes on each model's
supply, against the cluster's, with worked numbers; what reads it (the live cycle's
workload and the simulator's) measures it on the GPUs placement may use."""

from __future__ import annotations

from fractions import Fraction

from gpuloom.events import GpuSpec, NodeCordoned, NodeRegistered, NodeSpec
from gpuloom.placement.fragmentation import Shape, Workload
from gpuloom.placement.inputs import typical_workload
from gpuloom.placement.scarcity import SCARCE_PRESSURE, scarce_models, with_scarcity
from gpuloom.sim.trace import TraceNode, TraceTask
from gpuloom.sim.trace import typical_workload as trace_workload
from gpuloom.testing.builders import LogBuilder, make_job_spec


def registered(name: str, count: int, model: str) -> NodeRegistered:
    gpus = [
        GpuSpec(index=i, uuid=f"{name}-{i}", model=model, memory_mib=40_960, pool="vgpu")
        for i in range(count)
    ]
    return NodeRegistered(node=name, spec=NodeSpec(gpus=gpus, cpu_milli=64_000, memory_mib=1 << 18))


ANY_WHOLE = Shape(0, 1000, 1)
T4_WHOLE = Shape(0, 1000, 1, frozenset({"T4"}))
T4_OR_P100_HALF = Shape(0, 500, 2, frozenset({"T4", "P100"}))


def test_pressure_with_worked_numbers() -> None:
    # demand: 6 x 1000 anywhere + 3 x 1000 on T4 + 1 x (2 x 500) on T4 or P100 = 10,000
    # bound: T4 3,000 + 500 = 3,500; P100 500.   supply: 80 G2, 15 T4, 5 P100 (100 GPUs)
    # pressure(T4) = (3,500 / 15) / (10,000 / 100) = 2.33; P100: (500 / 5) / 100 = 1.0
    workload = Workload(((ANY_WHOLE, 6), (T4_WHOLE, 3), (T4_OR_P100_HALF, 1)))
    supply = {"G2": 80, "T4": 15, "P100": 5}
    assert scarce_models(workload, supply) == {"T4", "P100"}
    # more P100 in the same 100 GPUs: at 16, (500 / 16) / 100 = 0.3125, above 3/10; at 17,
    # 0.294, below
    assert scarce_models(workload, {"G2": 69, "T4": 15, "P100": 16}) == {"T4", "P100"}
    assert scarce_models(workload, {"G2": 68, "T4": 15, "P100": 17}) == {"T4"}
    assert Fraction(500, 16) / 100 > SCARCE_PRESSURE > Fraction(500, 17) / 100
    # the cluster's ratio counts: 33 P100 among 100 GPUs, (500 / 33) / 100 = 0.15; among
    # 200, (500 / 33) / 50 = 0.303
    assert scarce_models(workload, {"G2": 52, "T4": 15, "P100": 33}) == {"T4"}
    assert scarce_models(workload, {"G2": 152, "T4": 15, "P100": 33}) == {"T4", "P100"}


def test_nothing_is_scarce_without_bound_shapes_supply_or_demand() -> None:
    assert scarce_models(Workload(((ANY_WHOLE, 5),)), {"T4": 1}) == frozenset()
    assert scarce_models(Workload(((T4_WHOLE, 5),)), {"G2": 8}) == frozenset()  # no T4 here
    assert scarce_models(Workload(((T4_WHOLE, 5),)), {}) == frozenset()
    assert scarce_models(Workload(((Shape(4000, 0, 0), 5),)), {"T4": 1}) == frozenset()
    unbound = Workload(((ANY_WHOLE, 5),))
    assert with_scarcity(unbound, iter(["T4"])) is unbound


def test_the_live_workload_measures_scarcity_on_ready_uncordoned_nodes() -> None:
    log = LogBuilder()
    log.append(registered("g", 8, "G2"))
    log.append(registered("t", 2, "T4"))
    for number in range(8):  # one job in eight bound to T4
        log.submit(f"j{number}", make_job_spec(1, gpu_model=[] if number else ["T4"]))
    # demand 8,000, bound 1,000: (1,000 / 2) / (8,000 / 10) = 0.625 -> scarce
    assert typical_workload(log.state()).scarce == {"T4"}
    log.append(registered("t2", 8, "T4"))  # (1,000 / 10) / (8,000 / 18) = 0.225
    assert typical_workload(log.state()).scarce == set()
    log.append(NodeCordoned(node="t2", reason="maintenance"))  # placement may not use it
    assert typical_workload(log.state()).scarce == {"T4"}


def test_the_simulator_reads_the_same_scarcity_from_its_node_list() -> None:
    nodes = [TraceNode("g", 64_000, 0, 8, "G2"), TraceNode("t", 64_000, 0, 2, "T4")]
    tasks = [TraceTask(f"p{n}", 1000, 0, 1, 1000, () if n else ("T4",)) for n in range(8)]
    assert trace_workload(tasks, nodes).scarce == {"T4"}
    assert trace_workload(tasks, [*nodes, TraceNode("t2", 64_000, 0, 8, "T4")]).scarce == set()

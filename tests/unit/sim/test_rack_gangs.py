"""#38 item 3 on a replay: a blocked whole-rack gang reserves one rack at its earliest
start, backfill keeps every job that would outlast that start off the reserved GPUs,
and the gang starts no later than it was first promised (`gpuloom.sim.queue_sim` with
the seeded stream of `gpuloom.sim.rack_stream`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from gpuloom.placement.outcomes import Outcome, Placed, Reserved
from gpuloom.placement.policies import BestFit, Random
from gpuloom.placement.resources import Request
from gpuloom.sim.domains import in_one_domain
from gpuloom.sim.queue_sim import GREEDY, TimedTask, simulate
from gpuloom.sim.rack_stream import Shape, rack_cluster, stream, whole_rack
from gpuloom.sim.trace import TraceNode, TraceTask

#: 3 racks of 2 nodes of 4 GPUs, about 90% offered load, one job in ten a whole-rack gang.
SMALL = Shape(racks=3, nodes_per_rack=2, gpus_per_node=4, jobs=300, mean_gap_s=450,
              gang_share=0.1)  # fmt: skip


@dataclass
class Watch:
    """Every pass's reservation and what the same pass placed after it."""

    places: dict[str, dict[str, str]]
    reserved: list[tuple[int, Reserved, list[Placed]]] = field(default_factory=list)
    #: Job -> the first start (s) a reservation promised it.
    promised: dict[int, int] = field(default_factory=dict)

    def __call__(self, now: int, outcomes: list[Outcome]) -> None:
        for number, outcome in enumerate(outcomes):
            if isinstance(outcome, Reserved):
                after = [o for o in outcomes[number + 1 :] if isinstance(o, Placed)]
                self.reserved.append((now, outcome, after))
                start = outcome.reservation.start_at
                assert start is not None, "every job of the stream has a time limit"
                self.promised.setdefault(int(outcome.reservation.job_id), start // 1000)


@pytest.mark.parametrize("policy", [BestFit(), Random()], ids=["bestfit", "random"])
def test_the_head_gang_reserves_one_rack_backfill_keeps_off_it_and_it_starts_in_time(
    policy: BestFit | Random,
) -> None:
    nodes, places = rack_cluster(SMALL)
    tasks = stream(SMALL, 11)
    watch = Watch(places)
    run = simulate(nodes, tasks, policy, "priority+backfill", places=places, observe=watch)
    gangs = [(now, r, after) for now, r, after in watch.reserved
             if whole_rack(tasks[int(r.reservation.job_id)], SMALL)]  # fmt: skip
    assert len(gangs) > 20 and run.backfilled > 50, "the replay is not vacuous"
    kept_off = 0
    for now, reserved, after in gangs:
        replicas = reserved.reservation.replicas
        hosts = [r.host for r in replicas] + [p.node for r in replicas for p in r.slices]
        assert in_one_domain(hosts, places, "rack"), "the reservation names one rack"
        gpus = {(p.node, p.index) for r in replicas for p in r.slices}
        start_s = (reserved.reservation.start_at or 0) // 1000
        for placed in after:
            limit = placed.candidate.time_limit_s or 0
            if now + limit > start_s:
                taken = {(p.node, p.index) for r in placed.placement.replicas for p in r.slices}
                assert not taken & gpus, f"job {placed.candidate.job_id} outlasts the start"
                kept_off += 1
    assert kept_off > 0, "some job that outlasts a gang's start backfilled elsewhere"
    for number, promised in watch.promised.items():
        started = tasks[number].arrival_s + run.wait_of[number]
        assert started <= promised, f"job {number} started after its first promised start"
    for number, task in enumerate(tasks):
        if whole_rack(task, SMALL):
            assert in_one_domain(run.nodes_of[number], places, "rack")


def test_without_reservations_a_long_job_takes_what_the_blocked_gang_waits_for() -> None:
    """One rack of two nodes of 2 GPUs. `a` (1 GPU) runs until 100 (limit 120); the
    gang (2 x 2 GPUs, the whole rack) arrives at 10 and reserves the rack for 120;
    `long` (1 GPU, 1000 s) arrives at 11. EASY keeps `long` off the rack until the gang
    has run; the greedy control starts it at once and the gang waits for it."""
    nodes = [TraceNode(f"n{i}", 64_000, 256_000, 2, "A") for i in range(2)]
    places = {n.name: {"nvlink": n.name, "rack": "r0"} for n in nodes}
    gang = Request(gpus=2, cpu_milli=1000, memory_mib=1024, replicas=2,
                   topology=("rack", "required"))  # fmt: skip

    def task(name: str, gpus: int, arrival: int, runtime: int) -> TimedTask:
        return TimedTask(TraceTask(name, 1000, 1024, gpus, 1000, ()), arrival, runtime, 0)

    tasks = [task("a", 1, 0, 100), TimedTask(task("g", 2, 10, 50).task, 10, 50, 0, gang),
             task("long", 1, 11, 1000)]  # fmt: skip
    easy = simulate(nodes, tasks, BestFit(), "priority+backfill", places=places)
    assert easy.wait_of == {0: 0, 1: 90, 2: 139}, "g starts when a ends; long after g"
    greedy = simulate(nodes, tasks, BestFit(), GREEDY, places=places)
    assert greedy.wait_of == {0: 0, 1: 1001, 2: 0}, "long starts at once; g waits for it"
    assert greedy.backfilled == 1, "long started while g waited"

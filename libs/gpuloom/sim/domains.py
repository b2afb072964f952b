"""Topology for the queueing what-if: the trace's nodes grouped into domains, its
multi-GPU tasks as gangs that may ask for one domain, and the figures of #38 item 6.

The trace names no topology, and its multi-GPU tasks are single pods (every GPU on one
node), which any topology holds trivially. So, deterministically:

- `racks`: the nodes in name order, each `per_rack` consecutive ones a rack (`r000`,
  `r001`, ...), each node its own NVLink domain (levels `nvlink` < `rack`);
- `as_gang`: a task of k > 1 GPUs becomes a gang of ceil(k / g) replicas of g GPUs
  (`replica_gpus` = g; its CPU and memory split evenly, rounded up), which may land on
  several nodes, asking `ask` (a level and `required` or `preferred`, or nothing: the
  same gangs without topology). Tasks of one GPU or less are left as they are.

`figures` reads a run: the share of gangs inside one domain of each level, the wait of
the large jobs (at least `large_gpus` GPUs in all: the large gangs, or the large pods of
a run without gangs) and GPU utilisation over a window.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from gpuloom.sim.queue_sim import QueueRun, TimedTask
from gpuloom.sim.trace import TraceNode

LEVELS = ("nvlink", "rack")
Mode = Literal["required", "preferred"]
Ask = tuple[str, Mode]


def racks(nodes: Sequence[TraceNode], per_rack: int) -> dict[str, dict[str, str]]:
    """Each node's place, by name: its own NVLink domain and its rack, the nodes in name
    order `per_rack` to a rack."""
    if per_rack < 1:
        raise ValueError("a rack holds at least one node")
    ordered = sorted(node.name for node in nodes)
    width = len(str(max(0, (len(ordered) - 1) // per_rack)))
    return {
        name: {"nvlink": name, "rack": f"r{number // per_rack:0{max(3, width)}d}"}
        for number, name in enumerate(ordered)
    }


def as_gang(timed: TimedTask, replica_gpus: int, ask: Ask | None) -> TimedTask:
    """`timed` as a gang of replicas of `replica_gpus` GPUs asking `ask` (module doc);
    a task of at most one GPU, unchanged."""
    task = timed.task
    if task.gpus <= 1:
        return timed
    replicas = math.ceil(task.gpus / replica_gpus)
    gpus = math.ceil(task.gpus / replicas)
    request = replace(
        task.request(),
        gpus=gpus,
        replicas=replicas,
        cpu_milli=math.ceil(task.cpu_milli / replicas),
        memory_mib=math.ceil(task.memory_mib / replicas),
        topology=ask,
    )
    return replace(timed, asks=request)


def is_gang(timed: TimedTask) -> bool:
    return timed.asks is not None and timed.asks.replicas > 1


def total_gpus(timed: TimedTask) -> int:
    request = timed.request()
    return request.gpus * request.replicas


def in_one_domain(
    nodes: Sequence[str], places: Mapping[str, Mapping[str, str]], level: str
) -> bool:
    """Whether every node of `nodes` names the same domain of `level`."""
    found = {places.get(node, {}).get(level) for node in nodes}
    return len(found) == 1 and None not in found


@dataclass(frozen=True, slots=True)
class Figures:
    """What one run says about its gangs (item 6 of #38)."""

    gangs: int
    #: Level -> how many of the started gangs lie inside one domain of it.
    inside: dict[str, int]
    started_gangs: int
    #: Jobs of at least `large_gpus` GPUs in all (gangs or not).
    large: int
    #: Waits (s) of the large jobs that started, in task order.
    large_waits: list[int]
    utilisation: float

    def share_inside(self, level: str) -> float:
        return self.inside.get(level, 0) / self.started_gangs if self.started_gangs else 0.0

    @property
    def large_mean_wait(self) -> float:
        return sum(self.large_waits) / len(self.large_waits) if self.large_waits else 0.0

    @property
    def large_p95_wait(self) -> float:
        waits = sorted(self.large_waits)
        return float(waits[max(0, math.ceil(0.95 * len(waits)) - 1)]) if waits else 0.0


def figures(
    run: QueueRun,
    tasks: Sequence[TimedTask],
    places: Mapping[str, Mapping[str, str]],
    large_gpus: int,
    window: tuple[int, int],
) -> Figures:
    """The share of started gangs inside one domain of each level, the waits of the large
    jobs (at least `large_gpus` GPUs in all) and utilisation over `window` (s)."""
    gangs = [number for number, timed in enumerate(tasks) if is_gang(timed)]
    started = [number for number in gangs if number in run.nodes_of]
    inside = {
        level: sum(1 for n in started if in_one_domain(run.nodes_of[n], places, level))
        for level in LEVELS
    }
    large = [number for number, timed in enumerate(tasks) if total_gpus(timed) >= large_gpus]
    return Figures(
        gangs=len(gangs),
        inside=inside,
        started_gangs=len(started),
        large=len(large),
        large_waits=[run.wait_of[n] for n in large if n in run.wait_of],
        utilisation=run.utilisation(*window),
    )

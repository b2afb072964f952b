"""A seeded workload for #38 item 3: a stream of small jobs with occasional whole-rack
gangs, on a cluster of racks, for the queueing what-if (`gpuloom.sim.queue_sim`).

- the cluster: `racks` racks of `nodes_per_rack` nodes of `gpus_per_node` GPUs, each
  node its own NVLink domain (levels `nvlink` < `rack`, `rack_cluster`);
- the jobs (`stream`): one arrives every `mean_gap_s` seconds on average (uniform in
  [0, 2 * mean_gap_s]); a share `gang_share` of them are whole-rack gangs, one replica
  of `gpus_per_node` GPUs per node of a rack, asking `gang_ask` (`rack` required unless
  told otherwise); the rest are small, one replica of 1 to 4 GPUs, short (1 to 30
  minutes) or, a share `long_share` of them, long (1 to 4 hours). Gangs run 30 minutes
  to 2 hours. Time limits are the runtimes rounded up to the minute (`TimedTask`).

Everything is drawn from one `random.Random(seed)`, in job order: the same seed and
shape give the same stream. Nothing else in the replay draws.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.resources import Request
from gpuloom.sim.domains import Ask
from gpuloom.sim.queue_sim import TimedTask
from gpuloom.sim.trace import TraceNode, TraceTask

#: A node's CPU (milli) and memory (MiB), and what a job asks per GPU: never the limit.
NODE_CPU, NODE_MEMORY = 128_000, 1_048_576
CPU_PER_GPU, MEMORY_PER_GPU = 4_000, 16_384
MODEL = "H100"


@dataclass(frozen=True, slots=True)
class Shape:
    """The cluster and the stream (module doc)."""

    racks: int = 8
    nodes_per_rack: int = 4
    gpus_per_node: int = 8
    jobs: int = 2000
    mean_gap_s: int = 60
    gang_share: float = 0.03
    long_share: float = 0.3
    short_s: tuple[int, int] = (60, 1800)
    long_s: tuple[int, int] = (3600, 14_400)
    gang_s: tuple[int, int] = (1800, 7200)
    gang_ask: Ask | None = ("rack", "required")

    @property
    def rack_gpus(self) -> int:
        return self.nodes_per_rack * self.gpus_per_node


def rack_cluster(shape: Shape) -> tuple[list[TraceNode], dict[str, dict[str, str]]]:
    """The nodes (`r0n0`, `r0n1`, ...) and each one's place: its rack and its own NVLink
    domain."""
    nodes, places = [], {}
    for rack in range(shape.racks):
        for number in range(shape.nodes_per_rack):
            name = f"r{rack}n{number}"
            nodes.append(TraceNode(name, NODE_CPU, NODE_MEMORY, shape.gpus_per_node, MODEL))
            places[name] = {"nvlink": name, "rack": f"r{rack}"}
    return nodes, places


def whole_rack(task: TimedTask, shape: Shape) -> bool:
    """Whether `task` is one of the stream's whole-rack gangs."""
    return task.asks is not None and task.asks.replicas == shape.nodes_per_rack


def stream(shape: Shape, seed: int) -> list[TimedTask]:
    """The jobs, in arrival order (module doc); names `j00000`, `j00001`, ..."""
    rng = random.Random(seed)
    jobs = []
    arrival = 0
    for number in range(shape.jobs):
        arrival += rng.randint(0, 2 * shape.mean_gap_s)
        name = f"j{number:05d}"
        if rng.random() < shape.gang_share:
            gpus, replicas = shape.gpus_per_node, shape.nodes_per_rack
            runtime = rng.randint(*shape.gang_s)
            ask = shape.gang_ask
        else:
            gpus, replicas = rng.randint(1, 4), 1
            runtime = rng.randint(
                *(shape.long_s if rng.random() < shape.long_share else shape.short_s)
            )
            ask = None
        task = TraceTask(name, gpus * CPU_PER_GPU, gpus * MEMORY_PER_GPU, gpus, MILLI_PER_GPU, ())
        request = Request(
            gpus=gpus,
            cpu_milli=task.cpu_milli,
            memory_mib=task.memory_mib,
            replicas=replicas,
            topology=ask,
        )
        jobs.append(TimedTask(task, arrival, runtime, 0, request if replicas > 1 else None))
    return jobs

"""The Alibaba GPU trace v2023 (openb) as placement inputs: nodes and tasks.

The trace's node list gives each node's CPU, memory, GPU count and model; the
pod list gives each task's CPU, memory, GPU count, per-GPU share and allowed
models (`|`-separated). Tasks become `Request`s of the shared placement core;
in the published protocol every GPU is shareable, so the trace's GPUs are
in the vGPU pool. See `../shared/traces/alibaba-gpu-v2023/EVALUATION.md` §2.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.fragmentation import Shape, Workload
from gpuloom.placement.resources import GpuView, NodeView, Request
from gpuloom.placement.scarcity import with_scarcity


@dataclass(frozen=True, slots=True)
class TraceNode:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    model: str

    def view(self, rank: int) -> NodeView:
        return NodeView(
            name=self.name,
            rank=rank,
            gpus=[
                GpuView(i, f"{self.name}/{i}", self.model, "vgpu", memory_mib=0)
                for i in range(self.gpus)
            ],
            cpu_free_milli=self.cpu_milli,
            memory_free_mib=self.memory_mib,
        )


@dataclass(frozen=True, slots=True)
class TraceTask:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: int
    gpu_milli: int  # per GPU, in (0, 1000]; 0 for a CPU-only task
    models: tuple[str, ...]

    @property
    def demand_milli(self) -> int:
        return self.gpus * self.gpu_milli

    @property
    def kind(self) -> str:
        """The failure categories of the paper: cpu, share, or the GPU count."""
        if self.gpus == 0:
            return "cpu"
        if self.gpu_milli < MILLI_PER_GPU:
            return "share"
        return f"{self.gpus}-gpu"

    def request(self) -> Request:
        return Request(
            gpus=self.gpus,
            gpu_milli=self.gpu_milli if self.gpus else MILLI_PER_GPU,
            cpu_milli=self.cpu_milli,
            memory_mib=self.memory_mib,
            models=self.models,
        )

    def shape(self) -> Shape:
        return Shape(self.cpu_milli, self.gpu_milli, self.gpus, frozenset(self.models))


def load_nodes(path: Path) -> list[TraceNode]:
    with path.open(newline="") as handle:
        return [
            TraceNode(
                row["sn"],
                int(row["cpu_milli"]),
                int(row["memory_mib"]),
                int(row["gpu"]),
                row["model"],
            )
            for row in csv.DictReader(handle)
        ]


def load_tasks(path: Path) -> list[TraceTask]:
    tasks = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            gpus = int(row["num_gpu"])
            share = min(max(int(row["gpu_milli"] or 0), 1), MILLI_PER_GPU) if gpus else 0
            cpu = int(row["cpu_milli"]) or 100  # the simulator turns a 0 request into 100
            models = tuple(sorted(m for m in (row.get("gpu_spec") or "").split("|") if m))
            tasks.append(TraceTask(row["name"], cpu, int(row["memory_mib"]), gpus, share, models))
    return tasks


def typical_workload(tasks: list[TraceTask], nodes: list[TraceNode]) -> Workload:
    """FGD's M: the most frequent task shapes of the file covering 95% of its tasks,
    with the GPU models scarce on `nodes` (as the live placement cycle reads it)."""
    workload = Workload.typical(task.shape() for task in tasks)
    return with_scarcity(workload, (node.model for node in nodes for _ in range(node.gpus)))

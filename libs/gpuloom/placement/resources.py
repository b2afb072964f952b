"""The resource model placement works on: GPUs in two pools, per-replica requests, slices.

Every GPU is in the `physical` pool (allocated whole, exclusively) or the `vgpu`
pool (1000 milli-GPU of compute and its memory, sliced among jobs). Both are
described the same way here: a GPU has `milli_free` (0..1000) and
`memory_free_mib`; a whole GPU is taken by setting both to 0, a slice takes
its share. A physical GPU only ever serves whole-GPU requests.

These are the views a policy scores. They are plain mutable objects because a
placement cycle (or a simulation) applies each choice to them before the next
decision; `NodeView.state_key` is what lets the engine score one node per group
of identical nodes (see `gpuloom.placement.engine`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.state.feasibility import (
    KUBERNETES,
    gpu_kind_refusal,
    gpu_room_refusal,
    host_refusal,
)

Pool = Literal["physical", "vgpu"]
PoolChoice = Literal["physical", "vgpu", "any"]
Locality = Literal["local-only", "local-first", "any"]


@dataclass(slots=True)
class GpuView:
    index: int
    uuid: str
    model: str
    pool: Pool
    memory_mib: int
    milli_free: int = MILLI_PER_GPU
    memory_free_mib: int = -1  # -1: all of memory_mib (set in __post_init__)

    def __post_init__(self) -> None:
        if self.memory_free_mib < 0:
            self.memory_free_mib = self.memory_mib

    @property
    def idle(self) -> bool:
        return self.milli_free == MILLI_PER_GPU and self.memory_free_mib == self.memory_mib


@dataclass(slots=True)
class NodeView:
    """A ready node as placement sees it: what is free on it now.

    `rank` is the tie-break: among equal scores the lowest rank wins. The live
    service ranks nodes by name; the trace simulator by a seeded permutation,
    as the published protocol does. `cpu_free_milli`/`memory_free_mib` of None
    mean the node does not declare them, so they do not constrain.
    """

    name: str
    rank: int
    gpus: list[GpuView] = field(default_factory=list)
    cpu_free_milli: int | None = None
    memory_free_mib: int | None = None
    labels: Mapping[str, str] = field(default_factory=dict)
    lends_remote_vgpu: bool = False
    #: Container runtimes the node's agent found (`NodeSpec.runtimes`).
    runtimes: tuple[str, ...] = ()
    #: Its place in the topology: level -> domain, tightest level first.
    topology: Mapping[str, str] = field(default_factory=dict)
    #: Memo of `fragmentation.node_state`; whatever changes the view calls `forget`.
    cached_state: tuple[object, ...] | None = field(default=None, compare=False)
    #: Memo of `gpu_signature`, cleared with `cached_state`.
    cached_gpus: tuple[tuple[str, str, int, int, int], ...] | None = field(
        default=None, compare=False
    )
    #: (table, number): the signature's number in a policy's table of signatures
    #: (`MemoisedDelta`), cleared with `cached_state`.
    cached_signature: tuple[object, int] | None = field(default=None, compare=False)

    def forget(self) -> None:
        """Drop the memos of the view's state: every change of its free resources calls this
        (`take`, `give_back`, and what backfill and preemption do to the views)."""
        self.cached_state = None
        self.cached_gpus = None
        self.cached_signature = None

    def state_key(self) -> tuple[object, ...]:
        """Everything a policy's node score may depend on, GPU order aside.

        Two nodes with equal keys get equal scores from every grouped policy, so
        the engine scores one of them and gives ties to the lowest rank.
        """
        return (
            self.cpu_free_milli,
            self.memory_free_mib,
            tuple(
                sorted(
                    (g.model, g.pool, g.milli_free, g.memory_free_mib, g.memory_mib)
                    for g in self.gpus
                )
            ),
            tuple(sorted(self.labels.items())),
            self.lends_remote_vgpu,
            self.runtimes,
            tuple(self.topology.items()),
        )

    @property
    def gpu_milli_free(self) -> int:
        return sum(g.milli_free for g in self.gpus)


@dataclass(frozen=True, slots=True)
class Request:
    """What one replica of a job needs; `replicas` copies are placed as a gang.

    `gpus` GPUs, each giving `gpu_milli` (1000: the whole GPU) and
    `gpu_memory_mib` (None: the same share of that GPU's memory).
    """

    gpus: int = 0
    gpu_milli: int = MILLI_PER_GPU
    gpu_memory_mib: int | None = None
    cpu_milli: int = 0
    memory_mib: int = 0
    models: tuple[str, ...] = ()
    pool: PoolChoice = "any"
    locality: Locality = "local-only"
    node_selector: tuple[tuple[str, str], ...] = ()
    replicas: int = 1
    #: The job names an image: its host must have a container runtime.
    container: bool = False
    #: The job stands for Kubernetes pods: only a Kubernetes node hosts it, and a
    #: Kubernetes node hosts nothing else (`state.feasibility.runtime_refusal`).
    kubernetes: bool = False
    #: (level, mode): all replicas inside one domain of `level` ("required"), or in as
    #: few as it can, the tightest level first ("preferred") (`placement.topology`).
    topology: tuple[str, Literal["required", "preferred"]] | None = None
    #: (level, domain): only the nodes of that domain (what `placement.topology` asks
    #: the engine for each domain it tries).
    within: tuple[str, str] | None = None

    @property
    def fractional(self) -> bool:
        return 0 < self.gpu_milli < MILLI_PER_GPU

    @property
    def gpu_demand_milli(self) -> int:
        """Milli-GPU one replica takes."""
        return self.gpus * self.gpu_milli

    def memory_for(self, gpu: GpuView) -> int:
        """MiB of `gpu`'s memory one slice takes."""
        if not self.fractional:
            return gpu.memory_mib  # a whole GPU comes with all its memory
        if self.gpu_memory_mib is not None:
            return self.gpu_memory_mib
        return -(-gpu.memory_mib * self.gpu_milli // MILLI_PER_GPU)  # ceiling share

    def shape(self) -> tuple[object, ...]:
        """What a per-request cache may key on (everything that affects a decision)."""
        return (
            self.gpus,
            self.gpu_milli,
            self.gpu_memory_mib,
            self.cpu_milli,
            self.memory_mib,
            self.models,
            self.pool,
            self.locality,
            self.node_selector,
            self.container,
            self.kubernetes,
            self.topology,
            self.within,
        )


@dataclass(frozen=True, slots=True)
class Slice:
    """`milli` and `memory_mib` of one GPU of `node`, given to a replica."""

    node: str
    index: int
    uuid: str
    milli: int
    memory_mib: int


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """Where one replica runs (`host`) and the GPU slices it holds (local or remote)."""

    host: str
    slices: tuple[Slice, ...]
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def remote(self) -> tuple[Slice, ...]:
        return tuple(s for s in self.slices if s.node != self.host)


@dataclass(frozen=True, slots=True)
class Placement:
    replicas: tuple[ReplicaPlacement, ...]


# --- the rules every policy shares --------------------------------------------------------


def gpu_serves(request: Request, gpu: GpuView) -> bool:
    """Could `gpu` give one slice of `request` now (model, pool, free share and memory)?

    The fold's rule (`gpuloom.state.feasibility`: `gpu_kind_refusal`, `gpu_room_refusal`)
    written out on the engine's view, as the engine asks it for every GPU it looks at:
    tests/unit/state/test_feasibility.py holds the two to the same answer."""
    if request.models and gpu.model not in request.models:
        return False
    if request.fractional:
        if gpu.pool != "vgpu" or request.pool == "physical":
            return False
        return gpu.milli_free >= request.gpu_milli and gpu.memory_free_mib >= request.memory_for(
            gpu
        )
    if request.pool != "any" and gpu.pool != request.pool:
        return False
    if request.gpu_memory_mib is not None and request.gpu_memory_mib > gpu.memory_mib:
        return False
    return gpu.milli_free == MILLI_PER_GPU and gpu.memory_free_mib == gpu.memory_mib


def gpu_serves_by_rule(request: Request, gpu: GpuView) -> bool:
    """`gpu_serves` as the fold's rule says it, for the tests that hold the two equal."""
    share = request.gpu_milli
    return (
        gpu_kind_refusal(
            request.models, request.pool, share, gpu.model, gpu.pool, gpu.memory_mib,
            request.gpu_memory_mib,
        ) is None
        and gpu_room_refusal(
            share, request.memory_for(gpu), gpu.milli_free, gpu.memory_free_mib, gpu.memory_mib
        ) is None
    )  # fmt: skip


def in_domain(request: Request, node: NodeView) -> bool:
    """The node is in the domain the request is kept within (any, when none)."""
    within = request.within
    return within is None or node.topology.get(within[0]) == within[1]


def host_fits(request: Request, node: NodeView) -> bool:
    """CPU, memory, node selector and a container runtime for an image: what a replica's
    host must have, GPUs aside; and the domain the request is kept within, if any. The
    fold's rule (`gpuloom.state.feasibility.host_refusal`) written out, as it runs for
    every node a decision changed (tests hold the two to the same answer)."""
    within = request.within
    if within is not None and node.topology.get(within[0]) != within[1]:
        return False
    if request.container and not node.runtimes:
        return False
    if request.kubernetes != (KUBERNETES in node.runtimes):
        return False
    cpu, memory = node.cpu_free_milli, node.memory_free_mib
    if cpu is not None and cpu < request.cpu_milli:
        return False
    if memory is not None and memory < request.memory_mib:
        return False
    if not request.node_selector:
        return True
    labels = node.labels
    return all(labels.get(key) == value for key, value in request.node_selector)


def host_fits_by_rule(request: Request, node: NodeView) -> bool:
    """`host_fits` as the fold's rule says it, for the tests that hold the two equal."""
    return in_domain(request, node) and (
        host_refusal(
            request.cpu_milli,
            request.memory_mib,
            node.cpu_free_milli,
            node.memory_free_mib,
            request.node_selector,
            node.labels,
            request.container,
            node.runtimes,
            kubernetes=request.kubernetes,
        )
        is None
    )


def serving_gpus(request: Request, node: NodeView) -> list[GpuView]:
    return [g for g in node.gpus if gpu_serves(request, g)]


def fits_locally(request: Request, node: NodeView) -> bool:
    """Can `node` host one replica with all its GPU slices on itself?

    `host_fits`, and `request.gpus` GPUs that `gpu_serves`, with `gpu_serves` written out
    for each kind of request: this runs for every node a decision changed, for every
    request shape a cycle asks about again (tests hold it to the two rules)."""
    if not host_fits(request, node):
        return False
    need = request.gpus
    if need == 0:
        return True
    models, milli, memory, count = request.models, request.gpu_milli, request.gpu_memory_mib, 0
    if 0 < milli < MILLI_PER_GPU:  # a fraction: a vGPU with room for the share and its memory
        if request.pool == "physical":
            return False
        for gpu in node.gpus:
            if gpu.pool != "vgpu" or gpu.milli_free < milli or (models and gpu.model not in models):
                continue
            share = memory if memory is not None else -(-gpu.memory_mib * milli // MILLI_PER_GPU)
            if gpu.memory_free_mib >= share:
                count += 1
                if count >= need:
                    return True
        return False
    pool = request.pool  # whole GPUs: idle ones of the pool, the models, enough memory
    for gpu in node.gpus:
        if gpu.milli_free != MILLI_PER_GPU or gpu.memory_free_mib != gpu.memory_mib:
            continue
        if (models and gpu.model not in models) or (pool != "any" and gpu.pool != pool):
            continue
        if memory is not None and memory > gpu.memory_mib:
            continue
        count += 1
        if count >= need:
            return True
    return False


def best_fit_gpus(request: Request, node: NodeView) -> list[GpuView]:
    """The default GPU choice: fractions on the fullest GPUs that still fit (lowest index
    on ties); whole GPUs the lowest-indexed idle ones."""
    gpus = serving_gpus(request, node)
    if request.fractional:
        gpus.sort(key=lambda g: (g.milli_free, g.index))
    else:
        gpus.sort(key=lambda g: g.index)
    return gpus[: request.gpus]


def take(node: NodeView, gpu: GpuView, request: Request) -> Slice:
    """Give one slice of `gpu` to `request` (mutates the view)."""
    memory = request.memory_for(gpu)
    node.forget()
    gpu.milli_free -= request.gpu_milli
    gpu.memory_free_mib -= memory
    return Slice(node.name, gpu.index, gpu.uuid, request.gpu_milli, memory)


def take_host(node: NodeView, request: Request) -> None:
    node.forget()
    if node.cpu_free_milli is not None:
        node.cpu_free_milli -= request.cpu_milli
    if node.memory_free_mib is not None:
        node.memory_free_mib -= request.memory_mib


def give_back(node: NodeView, index: int, milli: int, memory_mib: int) -> None:
    """Return a slice of GPU `index` to `node` (the inverse of `take`)."""
    node.forget()
    gpu = next(g for g in node.gpus if g.index == index)
    gpu.milli_free += milli
    gpu.memory_free_mib += memory_mib


def give_back_host(node: NodeView, cpu_milli: int, memory_mib: int) -> None:
    node.forget()
    if node.cpu_free_milli is not None:
        node.cpu_free_milli += cpu_milli
    if node.memory_free_mib is not None:
        node.memory_free_mib += memory_mib


def gpu_signature(node: NodeView) -> tuple[tuple[str, str, int, int, int], ...]:
    """Each GPU's (model, pool, free share, free memory, memory): all that a choice of GPUs
    on the node reads (memoised until the node changes).

    Sorted when the GPUs are all of one model and pool: then which index holds which
    state never changes what a choice leaves behind, so nodes alike but for the order
    of their GPUs share one signature. Otherwise in index order (the best-fitting
    others of a fraction on several GPUs are taken by index among equal shares).
    """
    cached = node.cached_gpus
    if cached is None:
        gpus = [
            (g.model, g.pool, g.milli_free, g.memory_free_mib, g.memory_mib)
            for g in sorted(node.gpus, key=lambda g: g.index)
        ]
        if len({(model, pool) for model, pool, *_ in gpus}) <= 1:
            gpus.sort()
        cached = tuple(gpus)
        node.cached_gpus = cached
    return cached

"""Whether replicas are a valid placement of a job where the state stands (the rules
of docs/placement.md), and taking what they hold: the fold's one check of every
JobPlaced and JobGrown."""

from __future__ import annotations

from collections.abc import Sequence

from gpuloom.events import JobSpec, ReplicaAssignment, SliceRef
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.state.feasibility import (
    HELD,
    gpu_kind_refusal,
    gpu_room_refusal,
    host_refusal,
    topology_refusal,
)
from gpuloom.state.model import ClusterState, GpuState, JobState
from gpuloom.state.step import Step


def slice_memory(gpu: GpuState, piece: SliceRef) -> int:
    return gpu.slice_memory(piece.milli, piece.memory_mib)


def assignment_problem(
    state: ClusterState,
    spec: JobSpec,
    replicas: list[ReplicaAssignment],
    joining: Sequence[ReplicaAssignment] | None = None,
) -> str | None:
    """Why `replicas` is not a valid placement of `spec` in `state`, or None.

    The rules of docs/placement.md: replica count (an elastic gang's between its
    minimum and maximum), hosts ready with CPU and memory room, one slice per GPU per
    replica, GPU model, pool (fractions from vgpu, physical GPUs whole and local),
    locality, lenders, and no GPU over 1000 milli or its memory. With `joining`, the
    replicas an elastic gang holds already: `replicas` join them (JobGrown), and a
    required topology holds for all of them together.
    """
    if joining is None:
        if spec.elastic and not spec.least_replicas <= len(replicas) <= spec.replicas:
            return (
                f"{len(replicas)} replicas placed, the job has {spec.least_replicas}"
                f" to {spec.replicas}"
            )
        if not spec.elastic and len(replicas) != spec.replicas:
            return f"{len(replicas)} replicas placed, the job has {spec.replicas}"
    share = spec.share_milli
    cpu_taken: dict[str, int] = {}
    memory_taken: dict[str, int] = {}
    gpu_taken: dict[tuple[str, int], tuple[int, int]] = {}
    for number, replica in enumerate(replicas):
        host = state.nodes.get(replica.host)
        if host is None or host.phase != "ready":
            return f"replica {number}: host {replica.host} is not ready"
        if replica.cpu_milli != spec.cpu_milli or replica.memory_mib != spec.memory_mib:
            return f"replica {number}: CPU/memory differ from the job's request"
        cpu_before = cpu_taken.get(host.name, 0)  # by this job's earlier replicas
        memory_before = memory_taken.get(host.name, 0)
        cpu, memory = host.spec.cpu_milli, host.spec.memory_mib  # 0: not declared, unbounded
        refused = host_refusal(
            replica.cpu_milli,
            replica.memory_mib,
            cpu - host.cpu_used - cpu_before if cpu else None,
            memory - host.memory_used - memory_before if memory else None,
            spec.node_selector.items(),
            host.spec.labels,
            spec.image is not None,
            host.spec.runtimes,
            kubernetes=spec.kubernetes is not None,
        )
        if refused is not None:
            return f"replica {number}: host {host.name} {refused}"
        cpu_taken[host.name] = cpu_before + replica.cpu_milli
        memory_taken[host.name] = memory_before + replica.memory_mib
        if len(replica.slices) != spec.gpus:
            return f"replica {number}: {len(replica.slices)} GPU slices, the job needs {spec.gpus}"
        seen: set[tuple[str, int]] = set()
        for piece in replica.slices:
            where = f"GPU {piece.node}/{piece.index}"
            if (piece.node, piece.index) in seen:
                return f"replica {number}: {where} given twice"
            seen.add((piece.node, piece.index))
            node = state.nodes.get(piece.node)
            if node is None or node.phase != "ready":
                return f"replica {number}: node {piece.node} is not ready"
            gpu = node.gpus.get(piece.index)
            if gpu is None or gpu.uuid != piece.uuid:
                return (
                    f"replica {number}: node {piece.node} has no GPU {piece.index} ({piece.uuid})"
                )
            fault = node.unhealthy.get(piece.index)
            if fault is not None:
                return f"replica {number}: {where} is out of service ({fault.text})"
            if piece.milli != share:
                return (
                    f"replica {number}: {where} slice of {piece.milli} milli, the job asks {share}"
                )
            refused = gpu_kind_refusal(
                spec.gpu_model, spec.pool, share, gpu.model, gpu.pool, gpu.memory_mib,
                spec.gpu_memory_mib,
            )  # fmt: skip
            if refused is not None:
                return f"replica {number}: {where} {refused}"
            if piece.node != replica.host:
                if gpu.pool == "physical":
                    return f"replica {number}: physical {where} cannot be remote"
                if spec.locality == "local-only":
                    return f"replica {number}: {where} is remote but the job is local-only"
                if not node.spec.lends_remote_vgpu:
                    return f"replica {number}: node {piece.node} does not lend remote vGPU"
            milli, memory = gpu_taken.get((piece.node, piece.index), (0, 0))
            need = slice_memory(gpu, piece)
            gpu_taken[(piece.node, piece.index)] = (milli + piece.milli, memory + need)
            refused = gpu_room_refusal(
                share,
                need,
                MILLI_PER_GPU - gpu.milli_used - milli,
                gpu.memory_mib - gpu.memory_used - memory,
                gpu.memory_mib,
            )
            if refused == HELD:
                holder = f"job {gpu.job_id}" if gpu.job_id else "another of its replicas"
                return f"replica {number}: {where} is held by {holder}"
            if refused is not None:
                return f"replica {number}: {where} {refused}"
    ask = spec.topology
    if ask is not None and ask.mode == "required":
        every = [*(joining or ()), *replicas]
        used = {r.host for r in every} | {p.node for r in every for p in r.slices}
        refused = topology_refusal(
            ask.level, {name: state.nodes[name].spec.domain(ask.level) for name in used}
        )
        if refused is not None:
            return f"topology required inside one {ask.level}: {refused}"
    return None


def hold_replicas(
    state: ClusterState, job: JobState, replicas: Sequence[ReplicaAssignment], step: Step
) -> None:
    """Take what `replicas` of `job` hold: CPU and memory on their hosts, their slices."""
    for replica in replicas:
        host = state.nodes[replica.host]
        step.changed_node(replica.host)
        for piece in replica.slices:
            step.changed_node(piece.node)
        cpu, memory = host.hosted.get(job.job_id, (0, 0))
        host.hosted[job.job_id] = (cpu + replica.cpu_milli, memory + replica.memory_mib)
        for piece in replica.slices:
            gpu = state.nodes[piece.node].gpus[piece.index]
            milli, memory = gpu.holders.get(job.job_id, (0, 0))
            gpu.holders[job.job_id] = (milli + piece.milli, memory + slice_memory(gpu, piece))


def milli_by_model(state: ClusterState, job: JobState) -> dict[str, int]:
    """Milli-GPU the job's replicas hold, by GPU model (those a shrink ended not counted)."""
    by_model: dict[str, int] = {}
    for _, replica in job.held_replicas():
        for piece in replica.slices:
            gpu = state.nodes[piece.node].gpus.get(piece.index)
            model = gpu.model if gpu is not None else "unknown"
            by_model[model] = by_model.get(model, 0) + piece.milli
    return dict(sorted(by_model.items()))


def held_milli(job: JobState) -> int:
    """Milli-GPU the job's replicas hold (those a shrink ended not counted)."""
    return sum(piece.milli for _, replica in job.held_replicas() for piece in replica.slices)

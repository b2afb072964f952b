"""Which pod an `Allocate` call is for, and what its container gets: a pure function.

The kubelet calls `Allocate` with N device IDs it picked itself (each GPU is
advertised as `split` interchangeable IDs, so the kubelet only counts). gpuloom
already chose the node and the GPUs and annotated the pod before it was bound
(`gpuloom.io/node`, `gpuloom.io/gpus`, `gpuloom.io/gpu-uuids`, and for a share
`gpuloom.io/gpu-milli` and `gpuloom.io/gpu-memory-mib`). `choose_pod` finds the
pod being started among the pods of this node: placed by gpuloom here, still
pending, not yet allocated, asking for N `gpuloom.io/gpu` in its containers'
limits; the oldest first (creation time, then namespace and name). Its GPUs are
gpuloom's, never the kubelet's pick.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.kube.pods import Pod, read_pod
from gpuloom.kube.vocabulary import (
    ALLOCATED,
    ATTEMPT,
    GPU_MILLI,
    GPU_RESOURCE,
    JOB,
    PLACED_GPUS,
    PLACED_MEMORY,
    PLACED_NODE,
    PLACED_UUIDS,
)


@dataclass(frozen=True)
class Slice:
    """One GPU (or a share of it) gpuloom gave the pod."""

    index: int
    uuid: str
    node: str | None = None  # another node that lends it (remote vGPU); None: this node
    memory_mib: int | None = None  # a share's GPU memory


@dataclass(frozen=True)
class Placement:
    """The GPUs gpuloom chose for a pod, from its annotations."""

    job_id: str
    slices: tuple[Slice, ...]
    milli: int | None = None  # a share of each GPU (1..999), or None for whole GPUs
    attempt: str = ""

    @property
    def local(self) -> tuple[Slice, ...]:
        return tuple(s for s in self.slices if s.node is None)

    @property
    def remote(self) -> tuple[Slice, ...]:
        return tuple(s for s in self.slices if s.node is not None)


@dataclass(frozen=True)
class Allocation:
    """The pod an `Allocate` call is for, and its container's environment."""

    namespace: str
    name: str
    containers: tuple[str, ...]  # the pod's containers that ask for gpuloom.io/gpu
    placement: Placement
    envs: dict[str, str]

    @property
    def allocated_value(self) -> str:
        """The value of the pod's `gpuloom.io/allocated` annotation: its GPU containers."""
        return ",".join(self.containers)


@dataclass(frozen=True)
class NoMatch:
    """No pod fits the call: why, for the kubelet's error and the plugin's log."""

    reason: str


class BadPlacement(ValueError):
    """A pod's gpuloom annotations cannot be read."""


def share_environment(placement: Placement) -> dict[str, str]:
    """The CUDA MPS limits of a share of GPUs (nothing for whole GPUs), as the agent
    sets them for its fraction jobs (docs/placement.md).

    `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` caps the compute share (milli / 10, rounded
    up, at least 1); `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` the memory of each local GPU
    the container sees, by its CUDA ordinal there: the container sees only its own
    GPUs, numbered from 0 in the order of `NVIDIA_VISIBLE_DEVICES` (the agent, too,
    keys the limit by ordinal in `CUDA_VISIBLE_DEVICES`, not by the host's index).
    Slices lent by other nodes are listed in `GPULOOM_REMOTE_GPUS`
    (`node/uuid:milli:memory_mib`) for a remote-GPU runtime to attach.
    """
    env: dict[str, str] = {}
    if placement.milli is not None:
        env["GPULOOM_GPU_MILLI"] = str(placement.milli)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, math.ceil(placement.milli / 10)))
        limited = [s for s in placement.local if s.memory_mib is not None]
        if limited and len(limited) == len(placement.local):
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{ordinal}={s.memory_mib}M" for ordinal, s in enumerate(limited)
            )
            env["GPULOOM_GPU_MEMORY_MIB"] = str(limited[0].memory_mib)
    if placement.remote:
        milli = placement.milli if placement.milli is not None else MILLI_PER_GPU
        env["GPULOOM_REMOTE_GPUS"] = ",".join(
            f"{s.node}/{s.uuid}:{milli}:{s.memory_mib or 0}" for s in placement.remote
        )
    return env


def container_environment(placement: Placement, node: str) -> dict[str, str]:
    """What the container gets: gpuloom's GPUs on this node (by UUID, for the NVIDIA
    container runtime; `none` when all of them are lent by other nodes) and its job."""
    local = placement.local
    env = {
        "NVIDIA_VISIBLE_DEVICES": ",".join(s.uuid for s in local) or "none",
        "GPULOOM_GPUS": ",".join(str(s.index) for s in local),
        "GPULOOM_GPU_UUIDS": ",".join(s.uuid for s in local),
        "GPULOOM_JOB_ID": placement.job_id,
        "GPULOOM_NODE": node,
    }
    if placement.attempt:
        env["GPULOOM_ATTEMPT"] = placement.attempt
    env.update(share_environment(placement))
    return env


def _int(value: str, what: str) -> int:
    text = value.strip()
    if not text.isascii() or not text.isdigit():
        raise BadPlacement(f"{what} {value[:40]!r} is not a whole number")
    return int(text)


def _list(value: str) -> list[str]:
    return [part.strip() for part in value.split(",") if part.strip()]


def read_placement(annotations: Mapping[str, str]) -> Placement:
    """The placement gpuloom annotated; raises BadPlacement on a malformed one.

    `gpuloom.io/gpus` lists the GPUs' indices on this node, and `node/index` for a
    slice another node lends; `gpuloom.io/gpu-uuids` their UUIDs in the same order;
    `gpuloom.io/gpu-memory-mib`, for a share, each slice's memory (or one for all).
    """
    entries = _list(annotations.get(PLACED_GPUS, ""))
    uuids = _list(annotations.get(PLACED_UUIDS, ""))
    if not entries:
        raise BadPlacement(f"{PLACED_GPUS} lists no GPU")
    if len(uuids) != len(entries):
        raise BadPlacement(f"{PLACED_UUIDS} lists {len(uuids)} GPUs, {PLACED_GPUS} {len(entries)}")
    memories: list[int | None] = [None] * len(entries)
    if PLACED_MEMORY in annotations:
        given = [_int(m, PLACED_MEMORY) for m in _list(annotations[PLACED_MEMORY])]
        if len(given) == 1:
            given = given * len(entries)
        if len(given) != len(entries) or min(given) <= 0:
            raise BadPlacement(
                f"{PLACED_MEMORY} {annotations[PLACED_MEMORY][:40]!r}: one positive MiB "
                f"for each of the {len(entries)} GPUs"
            )
        memories = list(given)
    slices = []
    for entry, uuid, memory in zip(entries, uuids, memories, strict=True):
        lender, _, index = entry.rpartition("/")
        slices.append(Slice(_int(index, PLACED_GPUS), uuid, lender or None, memory))
    milli = None
    if GPU_MILLI in annotations:
        milli = _int(annotations[GPU_MILLI], GPU_MILLI)
        if not 0 < milli <= MILLI_PER_GPU:
            raise BadPlacement(f"{GPU_MILLI} {milli} is not from 1 to {MILLI_PER_GPU}")
        if milli == MILLI_PER_GPU:  # a whole GPU: no share limits
            milli = None
    return Placement(
        job_id=annotations.get(JOB, ""),
        slices=tuple(slices),
        milli=milli,
        attempt=annotations.get(ATTEMPT, ""),
    )


def gpu_containers(pod: Mapping[str, Any]) -> tuple[str, ...]:
    """The names of the pod's containers that ask for gpuloom.io/gpu, in spec order."""
    names = []
    for container in (pod.get("spec") or {}).get("containers") or []:
        if not isinstance(container, dict):
            continue
        resources = container.get("resources") or {}
        if GPU_RESOURCE in (resources.get("limits") or {}) or GPU_RESOURCE in (
            resources.get("requests") or {}
        ):
            names.append(str(container.get("name", "")))
    return tuple(names)


def _passed_over(pod: Pod, count: int, node: str) -> str | None:
    """Why `pod` is not the one an `Allocate` of `count` on `node` is for (None: it may be)."""
    notes = pod.annotations
    if notes.get(PLACED_NODE) != node:
        return f"is placed on {notes.get(PLACED_NODE)!r}"
    if ALLOCATED in notes:
        return "is already allocated"
    if pod.deleting:
        return "is being deleted"
    if pod.phase != "Pending":
        return f"is {pod.phase}"
    if pod.problem is not None:
        return str(pod.problem)
    if pod.gpus != count:
        return f"wants {pod.gpus}"
    return None


def choose_pod(pods: Sequence[Mapping[str, Any]], count: int, node: str) -> Allocation | NoMatch:
    """The pod of `node` that an `Allocate` of `count` devices is for, or why there is none.

    A candidate was placed by gpuloom on `node` (`gpuloom.io/gpus` and `gpuloom.io/node`
    annotated), is not yet allocated, still pending and not being deleted, and its
    containers' gpuloom.io/gpu limits sum to `count` (as the extender counts them:
    `gpuloom.kube.pods.read_pod`). Of the candidates the oldest wins (creationTimestamp,
    then namespace and name), so that the answer does not depend on the order of `pods`;
    one whose annotations cannot be read is passed over.
    """
    candidates: list[tuple[Pod, Mapping[str, Any]]] = []
    passed: list[str] = []  # why each gpuloom pod of the node was passed over
    for obj in pods:
        pod = read_pod(dict(obj))
        if pod is None or PLACED_GPUS not in pod.annotations:
            continue
        why = _passed_over(pod, count, node)
        if why is not None:
            passed.append(f"{pod.namespace}/{pod.name} {why}")
            continue
        candidates.append((pod, obj))
    problems: list[str] = []
    for pod, obj in sorted(candidates, key=lambda c: (c[0].created, c[0].namespace, c[0].name)):
        try:
            placement = read_placement(pod.annotations)
        except BadPlacement as exc:
            problems.append(f"{pod.namespace}/{pod.name}: {exc}")
            continue
        return Allocation(
            namespace=pod.namespace,
            name=pod.name,
            containers=gpu_containers(obj),
            placement=placement,
            envs=container_environment(placement, node),
        )
    reason = f"no gpuloom-placed pod is waiting for {count} {GPU_RESOURCE} on this node ({node})"
    details = problems + passed
    if details:
        shown = "; ".join(details[:8]) + ("; ..." if len(details) > 8 else "")
        reason += f": {shown}"
    return NoMatch(reason)

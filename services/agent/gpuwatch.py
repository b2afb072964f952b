"""The GPU memory watch: stop a job that uses more GPU memory than its slice.

Where NVML answers, the agent reads, about once a second, which processes use
how much memory on which GPU, adds up each job's processes (its shim's process
group) per GPU, and stops a job over the memory of its slice on any GPU: the job
ends `failed` with reason `GpuMemoryExceeded`. Nodes watched this way report
`isolation: enforced`; without NVML (simulated nodes, no driver) they report
`advisory`, and the limits are only in the job's environment.

The arithmetic is pure (`over_limit`); NVML is behind `GpuMemoryProbe`, so tests
feed it readings.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from gpuloom.events.units import MILLI_PER_GPU
from services.agent.reconcile import Ensure

log = logging.getLogger(__name__)

REASON = "GpuMemoryExceeded"


class GpuMemoryProbe(Protocol):
    def usage(self) -> Mapping[int, Mapping[str, int]]:
        """pid -> {GPU uuid -> MiB used}, for every process using a GPU now."""
        ...


@dataclass(frozen=True, slots=True)
class Limit:
    """A running job's memory limit (MiB) on each local GPU, by uuid, and its group."""

    group: int
    per_gpu: Mapping[str, int]
    #: An image job's container id: its processes are the container's, not the group's.
    container: str | None = None

    @property
    def owner(self) -> int | str:
        return self.container if self.container is not None else self.group


def over_limit(
    usage: Mapping[int, Mapping[str, int]],
    limits: Mapping[tuple[str, int, int], Limit],
    group_of: Mapping[int, int],
    container_of: Mapping[int, str] | None = None,
) -> dict[tuple[str, int, int], str]:
    """Jobs using more than their slice on some GPU -> a reason naming GPU and amounts.

    A process counts for the container it runs in (`container_of`), else for its
    process group (`group_of`)."""
    used: dict[tuple[int | str, str], int] = {}
    for pid, gpus in usage.items():
        owner: int | str | None = (container_of or {}).get(pid)
        if owner is None:
            owner = group_of.get(pid)
        if owner is None:
            continue
        for uuid, mib in gpus.items():
            used[(owner, uuid)] = used.get((owner, uuid), 0) + mib
    found: dict[tuple[str, int, int], str] = {}
    for key, limit in sorted(limits.items()):
        for uuid, allowed in sorted(limit.per_gpu.items()):
            mib = used.get((limit.owner, uuid), 0)
            if mib > allowed:
                found[key] = (
                    f"{REASON}: {mib} MiB used on GPU {uuid}, the slice allows {allowed} MiB"
                )
                break
    return found


def memory_limits(action: Ensure) -> dict[str, int]:
    """GPU memory each local fraction allows, by GPU uuid (whole GPUs are not limited)."""
    return {
        piece.uuid: piece.memory_mib
        for piece in action.slices
        if piece.node == action.node and piece.milli < MILLI_PER_GPU
    }


def process_groups(pids: Sequence[int]) -> dict[int, int]:
    """pid -> process group id, for the pids that still exist."""
    groups = {}
    for pid in pids:
        try:
            groups[pid] = os.getpgid(pid)
        except (ProcessLookupError, PermissionError):
            continue
    return groups


class NvmlProbe:
    """GPU memory per process from NVML (pynvml); built only where NVML initialises."""

    def __init__(self) -> None:
        import pynvml

        pynvml.nvmlInit()
        self._nvml = pynvml
        self._handles = [
            pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())
        ]

    def usage(self) -> dict[int, dict[str, int]]:
        result: dict[int, dict[str, int]] = {}
        for handle in self._handles:
            uuid = self._nvml.nvmlDeviceGetUUID(handle)
            uuid = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
            for proc in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                mib = int((proc.usedGpuMemory or 0) // (1024 * 1024))
                result.setdefault(int(proc.pid), {})[uuid] = mib
        return result


def nvml_probe() -> NvmlProbe | None:
    """An NVML probe, or None where pynvml is missing or NVML does not answer."""
    try:
        return NvmlProbe()
    except Exception as exc:  # ImportError, pynvml.NVMLError
        log.info("GPU memory watch off (isolation advisory): %s", exc)
        return None

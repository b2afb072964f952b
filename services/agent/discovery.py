"""Discover the real node the agent runs on: its name, GPUs, CPUs and memory.

GPUs come from NVML (`pynvml`, imported only if installed) or else from
`nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`;
a machine with neither reports no GPUs. Model names are normalised the same way
on both paths (`NVIDIA H100 80GB HBM3` -> `H100-80GB-HBM3`) so that a node keeps
its spec whichever path answered.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import socket
import subprocess
from typing import Any

from gpuloom.events import GpuSpec, NodeSpec
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.inventory import parse_topology
from gpuloom.events.units import MILLI_PER_CPU
from services.agent.inventory_file import NAME_RULE, ServedNode

log = logging.getLogger(__name__)

NVIDIA_SMI_QUERY = [
    "--query-gpu=index,uuid,name,memory.total",
    "--format=csv,noheader,nounits",
]


class DiscoveryError(ValueError):
    """The local node cannot be described (e.g. an invalid node name)."""


def sanitise_node_name(raw: str) -> str:
    """A valid node name from a hostname: other characters become `-`, at most 63.

    `gpu01.example.com` -> `gpu01-example-com`. Raises DiscoveryError when nothing
    usable is left.
    """
    name = re.sub(r"[^A-Za-z0-9_-]", "-", raw.strip())
    name = name.lstrip("_-")[:63]
    if not SUBJECT_TOKEN.match(name):
        raise DiscoveryError(f"cannot make a node name out of {raw!r}: {NAME_RULE}")
    return name


def normalise_model(name: str) -> str:
    """`NVIDIA A100-SXM4-80GB` -> `A100-SXM4-80GB`; blanks become `-`."""
    name = name.strip()
    if name.upper().startswith("NVIDIA "):
        name = name[len("NVIDIA ") :]
    return re.sub(r"\s+", "-", name.strip()) or "unknown"


def parse_nvidia_smi(output: str) -> list[GpuSpec]:
    """Parse `nvidia-smi --query-gpu=index,uuid,name,memory.total` CSV (noheader, nounits).

    Blank lines are skipped; a memory of `[N/A]` counts as 0. Raises ValueError on a
    line that does not have the four fields.
    """
    gpus: list[GpuSpec] = []
    for number, line in enumerate(output.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            raise ValueError(f"nvidia-smi line {number}: expected 4 fields, got {line!r}")
        index, uuid, memory = fields[0], fields[1], fields[-1]
        model = ",".join(fields[2:-1])  # a name with a comma in it stays whole
        try:
            memory_mib = int(float(memory))
        except ValueError:
            memory_mib = 0
        gpus.append(
            GpuSpec(
                index=int(index), uuid=uuid, model=normalise_model(model), memory_mib=memory_mib
            )
        )
    return sorted(gpus, key=lambda g: g.index)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpus_from_nvml() -> list[GpuSpec] | None:
    """GPUs reported by NVML, or None when pynvml is missing or NVML fails."""
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # pynvml.NVMLError: no driver, no device
        log.info("NVML unavailable: %s", exc)
        return None
    try:
        gpus = []
        for index in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            gpus.append(
                GpuSpec(
                    index=index,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    model=normalise_model(_text(pynvml.nvmlDeviceGetName(handle))),
                    memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20),
                )
            )
        return gpus
    except Exception as exc:
        log.warning("NVML query failed: %s", exc)
        return None
    finally:
        with contextlib.suppress(Exception):  # nothing more to do about a failed shutdown
            pynvml.nvmlShutdown()


def gpus_from_nvidia_smi(timeout_s: float = 30.0) -> list[GpuSpec] | None:
    """GPUs reported by nvidia-smi, or None when it is missing or fails."""
    program = shutil.which("nvidia-smi")
    if program is None:
        return None
    try:
        done = subprocess.run(
            [program, *NVIDIA_SMI_QUERY],
            capture_output=True,
            text=True,
            timeout=timeout_s,
            check=True,
        )
        return parse_nvidia_smi(done.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        log.warning("nvidia-smi failed: %s", exc)
        return None


def cpu_milli() -> int:
    """CPUs this process may use, in milli-CPU."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    return count * MILLI_PER_CPU


def memory_mib() -> int:
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // (1 << 20)
    except (ValueError, OSError, AttributeError):
        return 0


#: What an agent that finds no GPU says (it refuses to start unless allowed).
NO_GPU_HELP = (
    "install the NVIDIA driver and gpuloom's NVML support (pip install 'gpuloom[nvml]'), "
    "or pass --allow-no-gpu (GPULOOM_AGENT_ALLOW_NO_GPU=true) to serve it as a node "
    "without GPUs"
)


def discover_local_node(
    name: str | None = None, *, allow_no_gpu: bool = False, topology: str = ""
) -> ServedNode:
    """The machine as one node: `name` (default: sanitised hostname) and its real GPUs.

    A machine where neither NVML nor nvidia-smi finds a GPU is refused (DiscoveryError)
    unless `allow_no_gpu`: an agent meant for a GPU node that registered with none would
    look ready and take no job. Without pynvml the GPUs come from nvidia-smi, and the
    GPU memory watch is off: that is said as a warning. `topology`: the node's place
    (`GPULOOM_AGENT_TOPOLOGY`, `parse_topology`); a bad one is a DiscoveryError."""
    node = sanitise_node_name(name if name is not None else socket.gethostname())
    if name is not None and node != name:
        raise DiscoveryError(f"invalid node name {name!r}: {NAME_RULE}")
    try:
        places = parse_topology(topology)
    except ValueError as exc:
        raise DiscoveryError(f"GPULOOM_AGENT_TOPOLOGY: {exc}") from None
    gpus = gpus_from_nvml()
    source = "NVML"
    if gpus is None:
        gpus, source = gpus_from_nvidia_smi(), "nvidia-smi"
        if gpus:
            log.warning(
                "node %s: NVML is not available (pip install 'gpuloom[nvml]'): GPUs come from "
                "nvidia-smi, and the GPU memory watch of fractional jobs is off",
                node,
            )
    if gpus is None:
        gpus, source = [], "nothing (no NVML, no nvidia-smi)"
    if not gpus and not allow_no_gpu:
        raise DiscoveryError(f"node {node}: no GPU found with {source}: {NO_GPU_HELP}")
    if not gpus:
        log.warning("node %s: no GPU found; serving it as a node without GPUs", node)
    log.info("node %s: %d GPU(s) found with %s", node, len(gpus), source)
    spec = NodeSpec(
        gpus=gpus,
        cpu_milli=cpu_milli(),
        memory_mib=memory_mib(),
        simulated=False,
        topology=places,
    )
    return ServedNode(node, spec)

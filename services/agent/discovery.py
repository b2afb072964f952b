"""Discover the real node the agent runs on: its name, GPUs, CPUs and memory.

GPUs come from NVML (`pynvml`, imported only if installed) or else from
`nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`;
a machine with neither reports no GPUs. Model names are normalised the same way
on both paths (`NVIDIA H100 80GB HBM3` -> `H100-80GB-HBM3`) so that a node keeps
its spec whichever path answered.
"""

from __future__ import annotations

import logging
import os
import re
import socket

from gpuloom.events import NodeSpec
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.inventory import parse_topology
from gpuloom.events.units import MILLI_PER_CPU
from gpuloom.gpus import (  # noqa: F401  (the agent's tests read them here)
    NVIDIA_SMI_QUERY,
    gpus_from_nvidia_smi,
    gpus_from_nvml,
    normalise_model,
    parse_nvidia_smi,
)
from services.agent.inventory_file import NAME_RULE, ServedNode

log = logging.getLogger(__name__)


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

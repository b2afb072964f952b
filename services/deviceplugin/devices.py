"""The node's GPUs, and the device IDs the plugin advertises for them.

GPUs come from `GPULOOM_DEVICE_PLUGIN_GPUS` when set (a count of simulated GPUs,
`GPU-sim-<node>-<index>` as the agent names declared ones), else from NVML
(`pynvml`, imported only if installed), else from
`nvidia-smi --query-gpu=index,uuid,name,memory.total --format=csv,noheader,nounits`.

Each GPU is advertised as `split` device IDs `<uuid>::<k>`: the kubelet only counts
them (so that several pods can share one GPU); gpuloom decides the real GPUs.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuloom.gpus import gpus_from_nvidia_smi, gpus_from_nvml, normalise_model
from gpuloom.kube.vocabulary import NODE_GPU_MEMORY, NODE_MODEL, NODE_SPLIT, NODE_UUIDS

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
#: The kubelet refuses a device ID longer than this.
MAX_DEVICE_ID = 63


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str = ""
    memory_mib: int = 0


def simulated_gpus(node: str, count: int) -> list[Gpu]:
    """`count` declared GPUs of `node`, with the uuids the agent gives declared GPUs."""
    return [Gpu(index=i, uuid=f"GPU-sim-{node}-{i}", model="simulated") for i in range(count)]


def discover_gpus(node: str, declared: int | None) -> list[Gpu]:
    """The GPUs to advertise: `declared` simulated ones, else NVML's, else nvidia-smi's."""
    if declared is not None:
        return simulated_gpus(node, declared)
    for source in (gpus_from_nvml, gpus_from_nvidia_smi):
        found = source()
        if found is not None:
            return [Gpu(g.index, g.uuid, g.model, g.memory_mib) for g in found]
    log.warning("no GPU found: neither NVML nor nvidia-smi answered")
    return []


def device_id(uuid: str, k: int) -> str:
    """The `k`-th device ID of the GPU `uuid` (a digest of the uuid if it is too long)."""
    ident = f"{uuid}::{k}"
    if len(ident) <= MAX_DEVICE_ID:
        return ident
    return f"{hashlib.sha256(uuid.encode()).hexdigest()[:32]}::{k}"


def device_ids(gpus: Sequence[Gpu], split: int) -> list[tuple[str, str]]:
    """(device ID, GPU uuid) of every advertised device: `split` per GPU, in GPU order."""
    return [(device_id(gpu.uuid, k), gpu.uuid) for gpu in gpus for k in range(split)]


def node_annotations(gpus: Sequence[Gpu], split: int, simulated: bool) -> dict[str, str]:
    """What the plugin writes on its Node for gpuloom's extender (`gpuloom.kube.nodes`):
    the split (the node's `gpuloom.io/gpu` capacity is GPUs x split) and the GPUs' UUIDs
    in index order, so that the GPUs gpuloom places pods on are the real ones; for real
    GPUs also their memory (the least of them) and model when they all have the same.
    A label of the same name, set by an operator, wins over these annotations."""
    ordered = sorted(gpus, key=lambda g: g.index)
    notes = {NODE_SPLIT: str(split), NODE_UUIDS: ",".join(g.uuid for g in ordered)}
    if simulated or not ordered:
        return notes
    memory = min(g.memory_mib for g in ordered)
    if memory > 0:
        notes[NODE_GPU_MEMORY] = str(memory)
    models = {normalise_model(g.model) for g in ordered}
    if len(models) == 1 and "" not in models:
        notes[NODE_MODEL] = models.pop()
    return notes


def nvml_health(uuids: Sequence[str]) -> Mapping[str, bool] | None:
    """Whether NVML still reaches each GPU (by uuid); None when NVML is not there at all.

    Deliberately simple: a GPU is unhealthy when NVML cannot find it or read its
    memory (fallen off the bus, XID-wedged); everything else counts as healthy.
    """
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    try:
        health: dict[str, bool] = {}
        for uuid in uuids:
            try:
                handle = pynvml.nvmlDeviceGetHandleByUUID(uuid)
                pynvml.nvmlDeviceGetMemoryInfo(handle)
                health[uuid] = True
            except Exception:
                health[uuid] = False
        return health
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()

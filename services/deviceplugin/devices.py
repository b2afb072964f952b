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
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuloom.kube.vocabulary import NODE_GPU_MEMORY, NODE_MODEL, NODE_SPLIT, NODE_UUIDS

log = logging.getLogger(__name__)

HEALTHY = "Healthy"
UNHEALTHY = "Unhealthy"
#: The kubelet refuses a device ID longer than this.
MAX_DEVICE_ID = 63

NVIDIA_SMI_QUERY = [
    "--query-gpu=index,uuid,name,memory.total",
    "--format=csv,noheader,nounits",
]


@dataclass(frozen=True)
class Gpu:
    index: int
    uuid: str
    model: str = ""
    memory_mib: int = 0


def simulated_gpus(node: str, count: int) -> list[Gpu]:
    """`count` declared GPUs of `node`, with the uuids the agent gives declared GPUs."""
    return [Gpu(index=i, uuid=f"GPU-sim-{node}-{i}", model="simulated") for i in range(count)]


def parse_nvidia_smi(output: str) -> list[Gpu]:
    """Parse `nvidia-smi --query-gpu=index,uuid,name,memory.total` CSV (noheader, nounits)."""
    gpus: list[Gpu] = []
    for number, line in enumerate(output.splitlines(), start=1):
        if not line.strip():
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) < 4:
            raise ValueError(f"nvidia-smi line {number}: expected 4 fields, got {line!r}")
        try:
            memory_mib = int(float(fields[-1]))
        except ValueError:  # [N/A]
            memory_mib = 0
        gpus.append(
            Gpu(
                index=int(fields[0]),
                uuid=fields[1],
                model=",".join(fields[2:-1]),
                memory_mib=memory_mib,
            )
        )
    return sorted(gpus, key=lambda g: g.index)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def gpus_from_nvml() -> list[Gpu] | None:
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
                Gpu(
                    index=index,
                    uuid=_text(pynvml.nvmlDeviceGetUUID(handle)),
                    model=_text(pynvml.nvmlDeviceGetName(handle)),
                    memory_mib=int(pynvml.nvmlDeviceGetMemoryInfo(handle).total) // (1 << 20),
                )
            )
        return gpus
    except Exception as exc:
        log.warning("NVML query failed: %s", exc)
        return None
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def gpus_from_nvidia_smi(timeout_s: float = 30.0) -> list[Gpu] | None:
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


def discover_gpus(node: str, declared: int | None) -> list[Gpu]:
    """The GPUs to advertise: `declared` simulated ones, else NVML's, else nvidia-smi's."""
    if declared is not None:
        return simulated_gpus(node, declared)
    for source in (gpus_from_nvml, gpus_from_nvidia_smi):
        found = source()
        if found is not None:
            return found
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


def normalise_model(name: str) -> str:
    """`NVIDIA A100-SXM4-80GB` -> `A100-SXM4-80GB`; blanks become `-` (as the agent does)."""
    name = name.strip()
    if name.upper().startswith("NVIDIA "):
        name = name[len("NVIDIA ") :]
    return re.sub(r"\s+", "-", name.strip())


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

"""The GPUs of this machine, as NVML or nvidia-smi report them: what the node agent
registers (`services.agent.discovery`) and what the Kubernetes device plugin advertises
(`services.deviceplugin.devices`), read one way."""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import subprocess
from typing import Any

from gpuloom.events import GpuSpec

log = logging.getLogger(__name__)

NVIDIA_SMI_QUERY = [
    "--query-gpu=index,uuid,name,memory.total",
    "--format=csv,noheader,nounits",
]


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

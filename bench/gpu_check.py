"""The real-GPU checks of issue #14, as one short prepared script for a machine with an
NVIDIA GPU and its driver (`python bench/gpu_check.py`, about a minute; exit 0 when
every check passed). No CUDA toolkit, PyTorch or compiler is needed: the jobs it starts
talk to the driver's own `libcuda.so.1` through ctypes.

1. **Discovery**: the agent's NVML path and its nvidia-smi path find the same GPUs
   (index, UUID, model, memory).
2. **CUDA_VISIBLE_DEVICES**: a job given one GPU by index, and one given it by UUID,
   see exactly one device, and it is that GPU.
3. **The GPU memory watch**: a job that allocates 1 GiB is seen by the agent's NVML
   probe in its process group, and `over_limit` stops it under a 512 MiB slice, not
   under a 2 GiB one.
4. **MPS limits**: with the MPS control daemon started here, a job with
   `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=1024M` (what the agent sets for a slice) can
   allocate 512 MiB and cannot allocate 2 GiB. Skipped, and said so, where
   `nvidia-cuda-mps-control` is missing.

It prints one line per check and a summary; it changes nothing on the machine that
outlives it (the MPS daemon it starts is stopped at the end).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "libs"),
]

from services.agent.discovery import gpus_from_nvidia_smi, gpus_from_nvml  # noqa: E402
from services.agent.gpuwatch import Limit, nvml_probe, over_limit, process_groups  # noqa: E402

#: A job: report what CUDA sees, allocate MiB (argv[1]), hold it, say whether it could.
JOB = textwrap.dedent(
    """
    import ctypes, sys, time
    cuda = ctypes.CDLL("libcuda.so.1")
    assert cuda.cuInit(0) == 0, "cuInit failed"
    count = ctypes.c_int()
    cuda.cuDeviceGetCount(ctypes.byref(count))
    device = ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(device), 0)
    uuid = (ctypes.c_ubyte * 16)()
    cuda.cuDeviceGetUuid(uuid, device)
    text = bytes(uuid).hex()
    print(f"devices {count.value} uuid GPU-{text[:8]}-{text[8:12]}-{text[12:16]}-"
          f"{text[16:20]}-{text[20:]}", flush=True)
    mib, hold = int(sys.argv[1]), float(sys.argv[2])
    if mib:
        context = ctypes.c_void_p()
        assert cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device) == 0, "no context"
        pointer = ctypes.c_uint64()
        status = cuda.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(mib << 20))
        print(f"alloc {mib} MiB status {status}", flush=True)
        time.sleep(hold)
    """
)

RESULTS: list[tuple[str, bool, str]] = []


def check(name: str, passed: bool, detail: str) -> None:
    RESULTS.append((name, passed, detail))
    print(f"{'PASS' if passed else 'FAIL'}  {name}: {detail}", flush=True)


def job(mib: int, hold_s: float, env: dict[str, str], wait: bool = True) -> subprocess.Popen[str]:
    """Start JOB in a process group of its own (as the agent's shim does)."""
    process = subprocess.Popen(
        [sys.executable, "-c", JOB, str(mib), str(hold_s)],
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    if wait:
        process.wait(120)
    return process


def discovery() -> list[tuple[int, str, str, int]]:
    nvml, smi = gpus_from_nvml(), gpus_from_nvidia_smi()
    as_rows = lambda gpus: [(g.index, g.uuid, g.model, g.memory_mib) for g in gpus or []]  # noqa: E731
    check("NVML finds GPUs", bool(nvml), f"{as_rows(nvml)}")
    check(
        "nvidia-smi finds the same", bool(smi) and as_rows(nvml) == as_rows(smi), f"{as_rows(smi)}"
    )
    return as_rows(nvml)


def visible_devices(gpus: list[tuple[int, str, str, int]]) -> None:
    index, uuid = gpus[-1][0], gpus[-1][1]
    for given in (str(index), uuid):
        env = {"CUDA_VISIBLE_DEVICES": given, "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        out = job(0, 0, env).stdout.read()  # type: ignore[union-attr]
        check(
            f"CUDA_VISIBLE_DEVICES={given}",
            f"devices 1 uuid {uuid}" in out,
            out.strip().replace("\n", " | "),
        )


def memory_watch(gpus: list[tuple[int, str, str, int]]) -> None:
    probe = nvml_probe()
    if probe is None:
        check("the memory watch's NVML probe", False, "NVML did not initialise")
        return
    uuid = gpus[0][1]
    running = job(1024, 20, {"CUDA_VISIBLE_DEVICES": "0"}, wait=False)
    try:
        deadline, usage, groups = time.monotonic() + 30, {}, {}
        while time.monotonic() < deadline:
            usage = {pid: gpus for pid, gpus in probe.usage().items()}
            groups = process_groups(list(usage))
            if any(groups.get(pid) == running.pid for pid in usage):
                break
            time.sleep(0.5)
        seen = {pid: used for pid, used in usage.items() if groups.get(pid) == running.pid}
        check("NVML sees the job's memory", bool(seen), f"{seen}")
        key = ("job", 1, 0)
        small = over_limit(usage, {key: Limit(running.pid, {uuid: 512})}, groups)
        large = over_limit(usage, {key: Limit(running.pid, {uuid: 2048})}, groups)
        check("over a 512 MiB slice: stopped", key in small, small.get(key, "not over"))
        check("within a 2 GiB slice: left alone", key not in large, large.get(key, "not over"))
    finally:
        running.kill()
        running.wait()


def mps_limits() -> None:
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        check("MPS limits", True, "SKIPPED: nvidia-cuda-mps-control is not installed here")
        return
    folder = Path(tempfile.mkdtemp(prefix="gpuloom-mps-"))
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": str(folder / "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": str(folder / "log"),
    }
    for sub in ("pipe", "log"):
        (folder / sub).mkdir()
    subprocess.run([control, "-d"], env={**os.environ, **env}, check=True)
    try:
        limited = {
            **env,
            "CUDA_VISIBLE_DEVICES": "0",
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M",
        }
        fits = job(512, 0, limited).stdout.read()  # type: ignore[union-attr]
        over = job(2048, 0, limited).stdout.read()  # type: ignore[union-attr]
        check("MPS: 512 MiB under a 1 GiB limit", "status 0" in fits, fits.strip())
        check("MPS: 2 GiB over a 1 GiB limit refused", "alloc 2048 MiB status 0" not in over,
              over.strip())  # fmt: skip
    finally:
        subprocess.run([control], input="quit\n", text=True, env={**os.environ, **env})


def main() -> int:
    gpus = discovery()
    if gpus:
        visible_devices(gpus)
        memory_watch(gpus)
        mps_limits()
    failed = [name for name, passed, _ in RESULTS if not passed]
    print(f"{len(RESULTS) - len(failed)} of {len(RESULTS)} checks passed" + (
        f"; failed: {', '.join(failed)}" if failed else ""))  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

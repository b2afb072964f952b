"""What a job's process gets: its environment, and whether its program can run at all."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuloom.events import JobSpec

#: Variables passed from the agent's own environment, when set; nothing else leaks.
INHERITED = ("PATH", "HOME", "LANG", "TMPDIR")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def base_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The minimal environment every job starts from."""
    base = {name: environ[name] for name in INHERITED if name in environ}
    base.setdefault("PATH", DEFAULT_PATH)
    return base


def job_environment(
    base: Mapping[str, str],
    spec: JobSpec,
    *,
    job_id: str,
    attempt: int,
    node: str,
    gpu_indexes: Sequence[int],
    gpu_uuids: Sequence[str],
) -> dict[str, str]:
    """`base`, then the job's own `spec.env`, then the variables gpuloom controls.

    The user cannot override the `GPULOOM_*` variables nor the GPU selection:
    `CUDA_VISIBLE_DEVICES` lists the assigned GPU indexes (empty for no GPU), in
    the PCI bus order that nvidia-smi and NVML number them by.
    """
    env = dict(base)
    env.update(spec.env)
    env.update(
        {
            "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in gpu_indexes),
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "GPULOOM_JOB_ID": job_id,
            "GPULOOM_NODE": node,
            "GPULOOM_ATTEMPT": str(attempt),
            "GPULOOM_GPU_UUIDS": ",".join(gpu_uuids),
        }
    )
    return env


def command_problem(program: str, path: str | None, cwd: Path) -> tuple[int, str] | None:
    """Why `program` cannot be executed, as the shell's (exit code, reason); None if it can.

    Mirrors the shell: a name with a `/` is a path (relative to `cwd`), any other
    name is searched in `path`. 127: not found; 126: found but not executable.
    """
    if "/" in program:
        candidate = Path(program) if os.path.isabs(program) else cwd / program
        if not candidate.exists():
            return 127, f"cannot run command: {program}: no such file"
        if candidate.is_dir() or not os.access(candidate, os.X_OK):
            return 126, f"cannot run command: {program}: permission denied"
        return None
    denied = False
    for folder in (path if path is not None else DEFAULT_PATH).split(os.pathsep):
        directory = Path(folder) if os.path.isabs(folder) else cwd / folder
        candidate = directory / program
        if candidate.is_file():
            if os.access(candidate, os.X_OK):
                return None
            denied = True
    if denied:
        return 126, f"cannot run command: {program}: permission denied"
    return 127, f"cannot run command: {program}: command not found"

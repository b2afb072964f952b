"""What a job's process gets: its environment, and whether its program can run at all."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from gpuloom.events import JobSpec, SliceRef
from gpuloom.events.text import reserved_env_reason
from gpuloom.events.units import MILLI_PER_GPU
from services.agent.reconcile import Ensure
from services.agent.rendezvous import Master, elastic_environment, launcher_environment

log = logging.getLogger(__name__)

#: Variables passed from the agent's own environment, when set; nothing else leaks.
#: (HOME, USER and LOGNAME are the job's account's: see `account_environment`.)
INHERITED = ("PATH", "LANG", "TMPDIR")
DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"
#: The kernel's limit on one argument or `NAME=value` string, its NUL included.
MAX_ARG_STRLEN = 32 * 4096


def base_environment(environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """The minimal environment every job starts from."""
    base = {name: environ[name] for name in INHERITED if name in environ}
    base.setdefault("PATH", DEFAULT_PATH)
    return base


def account_environment(name: str, home: Path) -> dict[str, str]:
    """Who the job runs as, and its HOME (its working directory)."""
    return {"HOME": str(home), "USER": name, "LOGNAME": name}


def reserved_names(env: Mapping[str, str]) -> list[str]:
    """The names in `env` that a job may not set (`reserved_env_reason`), sorted."""
    return sorted(name for name in env if reserved_env_reason(name) is not None)


def ensure_environment(
    base: Mapping[str, str], action: Ensure, user: str, home: Path, master: Master | None = None
) -> dict[str, str]:
    """The environment of `action`'s command, run as the account `user` in `home`; a
    gang's replica meets the others at `master` (`services.agent.rendezvous`)."""
    dropped = reserved_names(action.spec.env)
    if dropped:  # admission rejects these now; an older log may still hold one
        log.warning("job %s: env sets reserved %s: left out", action.job_id, ", ".join(dropped))
    return job_environment(
        {**base, **account_environment(user, home)},
        action.spec,
        job_id=action.job_id,
        attempt=action.attempt,
        node=action.node,
        gpu_indexes=action.gpu_indexes,
        gpu_uuids=action.gpu_uuids,
        slices=action.slices,
        replica=action.replica,
        hosts=action.hosts,
        array=(action.array_id, action.array_index) if action.array_id is not None else None,
        master=master,
    )


def job_environment(
    base: Mapping[str, str],
    spec: JobSpec,
    *,
    job_id: str,
    attempt: int,
    node: str,
    gpu_indexes: Sequence[int],
    gpu_uuids: Sequence[str],
    slices: Sequence[SliceRef] = (),
    replica: int = 0,
    hosts: Sequence[str] = (),
    array: tuple[str, int | None] | None = None,
    master: Master | None = None,
) -> dict[str, str]:
    """`base`, then the job's own `spec.env`, then the variables gpuloom controls.

    The user cannot override the `GPULOOM_*` variables nor the GPU selection:
    `CUDA_VISIBLE_DEVICES` lists the assigned GPU indexes (empty for no GPU), in
    the PCI bus order that nvidia-smi and NVML number them by. For vGPU slices
    see `sharing_environment`. A name of `spec.env` the scheduler reserves (which
    admission rejects, but an older log may hold) is left out, so one the agent
    does not set this time (`CUDA_MPS_*` of a whole GPU, `LD_PRELOAD`) cannot
    slip through either.
    """
    env = dict(base)
    env.update({k: v for k, v in spec.env.items() if reserved_env_reason(k) is None})
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
    env.update(sharing_environment(node, slices))
    if spec.min_replicas is not None:  # an elastic gang: its rendezvous numbers them
        env["GPULOOM_REPLICA"] = str(replica)
        if master is not None:
            env.update(elastic_environment(job_id, attempt, spec, master))
    elif len(hosts) > 1:  # a gang: each replica learns its rank and where the others run
        env["GPULOOM_REPLICA"] = str(replica)
        env["GPULOOM_REPLICAS"] = str(len(hosts))
        env["GPULOOM_REPLICA_HOSTS"] = ",".join(hosts)
        if master is not None:  # what distributed-training launchers read
            env.update(launcher_environment(replica, len(hosts), spec.gpus, master))
    if array is not None:  # a task of a job array
        env["GPULOOM_ARRAY_ID"] = array[0]
        env["GPULOOM_ARRAY_INDEX"] = str(array[1])
    return env


def sharing_environment(node: str, slices: Sequence[SliceRef]) -> dict[str, str]:
    """The variables of a job that holds fractions of GPUs or remote vGPU (docs/placement.md).

    Local fractions run under CUDA MPS: `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE` caps
    the compute share, `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` the memory of each
    visible device (by its ordinal in `CUDA_VISIBLE_DEVICES`). Remote slices are
    listed in `GPULOOM_REMOTE_GPUS` (`node/gpu-uuid:milli:memory_mib`) for a
    remote-GPU runtime to attach.
    """
    local = [s for s in slices if s.node == node]
    remote = [s for s in slices if s.node != node]
    env: dict[str, str] = {}
    fractions = [s for s in slices if s.milli < MILLI_PER_GPU]
    if fractions:
        milli = fractions[0].milli
        env["GPULOOM_GPU_MILLI"] = str(milli)
        env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(max(1, milli // 10))
        if local:
            env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] = ",".join(
                f"{ordinal}={s.memory_mib}M" for ordinal, s in enumerate(local)
            )
            env["GPULOOM_GPU_MEMORY_MIB"] = str(local[0].memory_mib)
    if remote:
        env["GPULOOM_REMOTE_GPUS"] = ",".join(
            f"{s.node}/{s.uuid}:{s.milli}:{s.memory_mib}" for s in remote
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


def spawn_problem(command: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why `execve` would refuse `command` with `env`, as a job's failure reason; None if not.

    The contract refuses such values, but the agent must not depend on every
    writer having checked: a word `execve` cannot take makes every spawn of the
    job raise, round after round. The reason names the offending word or
    variable, never its value (which may be a secret).
    """
    for index, word in enumerate(command):
        problem = _exec_word_problem(word)
        if problem is not None:
            return f"could not start: {problem} in argv[{index}]"
    for name in sorted(env, key=repr):
        if _exec_word_problem(name) is not None or not name or "=" in name:
            return f"could not start: invalid env variable name {repr(name)[:80]}"
        problem = _exec_word_problem(env[name])
        if problem is not None:
            shown = name[:80] if name.isprintable() else repr(name)[:80]
            return f"could not start: {problem} in env {shown}"
    return None


def exec_size_problem(command: Sequence[str], env: Mapping[str, str]) -> str | None:
    """Why `execve` would refuse `command` and `env` for their size (E2BIG), or None.

    Checked before the spawn: the command is executed by `launch.py`, whose
    failure would only show as exit status 126. Limits: one string (argument or
    `NAME=value`) at most `MAX_ARG_STRLEN` bytes with its NUL; all of them, with
    their pointers, at most `ARG_MAX`.
    """
    words = [os.fsencode(word) for word in command]
    words += [os.fsencode(f"{name}={value}") for name, value in env.items()]
    total = sum(len(word) + 1 + 8 for word in words)
    if any(len(word) + 1 > MAX_ARG_STRLEN for word in words) or total > os.sysconf("SC_ARG_MAX"):
        return f"could not start: {os.strerror(errno.E2BIG)}"
    return None


def _exec_word_problem(word: object) -> str | None:
    """What makes `word` impossible to pass to `execve`, or None."""
    if not isinstance(word, str):
        return f"{type(word).__name__} instead of text"
    if "\0" in word:
        return "embedded null byte"
    try:
        os.fsencode(word)
    except UnicodeEncodeError:
        return "text that is not valid Unicode"
    return None

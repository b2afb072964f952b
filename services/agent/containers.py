"""Jobs that name an image: the agent runs them with podman (docs/containers.md).

The shim runs `podman run` where it would run `launch.py`: the same run folder,
logs, signals and time limits. What changes is who switches to the job's account
(podman's `--user`, not `launch.py`) and what the job sees:

* its working directory (and HOME), mounted at the same path, and nothing else of
  the node's file system;
* the node's network (a gang's rendezvous works as for a process);
* only its own GPUs, through CDI (`--device nvidia.com/gpu=<uuid>`) on a node with
  real GPUs, renumbered from 0 as the container sees them;
* no capabilities and no way to gain privileges (`--cap-drop all`,
  `no-new-privileges`), so a container job can do no more than a process job;
* its environment from a file in the run folder (mode 0600), never through
  podman's own environment: podman runs as root, and a job's `LD_PRELOAD` must
  not reach it.

`podman run --init` puts catatonit in front of the command, which passes the
shim's SIGTERM on (podman's signal proxy hands it to the container). conmon
leaves the shim's process group, so the group SIGKILL that ends a process job
does not reach a container: the runner removes the container by name
(`podman rm -f`) whenever it kills and whenever a container run ends.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpuloom.events.units import MILLI_PER_CPU, MILLI_PER_GPU
from services.agent.identity import Account
from services.agent.reconcile import Ensure
from services.agent.shim import RunDir

log = logging.getLogger(__name__)

#: Where CDI specs live (the CDI specification's defaults); `nvidia-ctk cdi generate`
#: writes `nvidia.yaml` into one of them.
CDI_DIRS = (Path("/etc/cdi"), Path("/var/run/cdi"))
#: The CUDA MPS control daemon's default pipe directory, shared with fraction jobs.
MPS_PIPE_DIR = Path("/tmp/nvidia-mps")
#: Variables of the agent's environment podman itself needs (its configuration).
PODMAN_ENV = ("CONTAINERS_CONF", "CONTAINERS_STORAGE_CONF", "CONTAINERS_REGISTRIES_CONF")
#: Exit statuses of `podman run` itself (not of the command): 125 podman failed,
#: 126 the command could not be invoked, 127 it was not found.
PODMAN_STATUSES = frozenset({125, 126, 127})
#: A container's id in a process's cgroup path (`.../libpod-<id>...`).
_CONTAINER_IN_CGROUP = re.compile(r"libpod-(?:conmon-)?([0-9a-f]{64})")
#: catatonit's message when it cannot execute the command (`--init`).
_INIT_EXEC_FAILED = re.compile(r"^ERROR \(catatonit:\d+\): failed to exec pid1: (.+)$")
#: Files of a container run in its run folder.
NAME_FILE, CID_FILE, ENV_FILE = "container", "cid", "env"


@dataclass(frozen=True, slots=True)
class Podman:
    """How this node runs image jobs."""

    path: str
    #: podman's `--pull` policy (`GPULOOM_AGENT_IMAGE_PULL`).
    pull: str = "missing"
    #: The node's GPUs are real: pass each job's GPUs through CDI.
    gpu_devices: bool = False
    #: podman's own environment: a PATH and its configuration variables.
    environ: Mapping[str, str] = field(default_factory=dict)
    #: `--pids-limit` of every container (`GPULOOM_AGENT_MAX_PIDS`); 0: none.
    max_pids: int = 0

    def run_argv(
        self,
        *,
        name: str,
        run_dir: Path,
        work: Path,
        account: Account,
        image: str,
        command: Sequence[str],
        gpu_uuids: Sequence[str] = (),
        fractions: bool = False,
        labels: Mapping[str, str] | None = None,
        memory_mib: int = 0,
        cpu_milli: int = 0,
    ) -> list[str]:
        """The `podman run` of one job's attempt (`run_dir` holds its env file). The
        container is held to the job's request as a process job's cgroup is
        (`services.agent.cgroups`): its memory (`--memory`), CPU (`--cpus`) and
        processes (`--pids-limit`), each only where set; podman makes its cgroup."""
        argv = [
            self.path,
            "run",
            "--rm",
            f"--name={name}",
            f"--cidfile={run_dir / CID_FILE}",
            f"--pull={self.pull}",
            f"--user={account.uid}:{account.gid}",
            *[f"--group-add={gid}" for gid in account.groups if gid != account.gid],
            "--network=host",
            "--init",
            "--cap-drop=all",
            "--security-opt=no-new-privileges",
            f"--pids-limit={self.max_pids or -1}",
            *([f"--memory={memory_mib}m"] if memory_mib else []),
            *([f"--cpus={cpu_milli / MILLI_PER_CPU:g}"] if cpu_milli else []),
            "--log-driver=none",
            f"--env-file={run_dir / ENV_FILE}",
            f"--volume={work}:{work}",
            f"--workdir={work}",
        ]
        for key, value in sorted((labels or {}).items()):
            argv.append(f"--label={key}={value}")
        if self.gpu_devices:
            argv += [f"--device=nvidia.com/gpu={uuid}" for uuid in gpu_uuids]
            if fractions and MPS_PIPE_DIR.is_dir():  # CUDA MPS clients reach the daemon
                argv += ["--ipc=host", f"--volume={MPS_PIPE_DIR}:{MPS_PIPE_DIR}"]
        return [*argv, image, *command]

    def remove_argv(self, name: str) -> list[str]:
        """Stop at once and remove the container `name`, if it exists."""
        return [self.path, "rm", "--force", "--time=0", "--ignore", name]


def container_name(node: str, job_id: str, attempt: int, replica: int) -> str:
    """The container of one replica of one attempt: unique on the machine, even with
    several simulated nodes on it, and a valid podman name (node and job ids are
    subject tokens: letters, digits, `-` and `_`)."""
    return f"gpuloom-{node}-{job_id}-{attempt}-r{replica}"


def container_environment(env: Mapping[str, str], host_path: str | None) -> dict[str, str]:
    """The job's variables as the container gets them: the image's own PATH stays
    unless the job set one (`host_path`: the PATH the agent would have given a
    process, which names the node's folders, not the image's)."""
    inside = dict(env)
    if inside.get("PATH") == host_path:
        del inside["PATH"]
    inside.pop("TMPDIR", None)  # a folder of the node, not of the image
    return inside


def visible_devices(env: dict[str, str], count: int) -> None:
    """CDI gives a container only its GPUs, numbered from 0 in PCI order."""
    env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(count))


def env_file_problem(env: Mapping[str, str]) -> str | None:
    """Why `env` cannot be written as podman's `--env-file`, naming the variable, never
    its value; None if it can.

    podman reads the file line by line (at most 64 KiB each), trims blanks on the
    left, skips `#` comments, refuses blanks in a name and expands a name ending
    in `*` from its own environment: a variable that would be read otherwise is
    refused rather than passed changed.
    """
    for name in sorted(env):
        shown = repr(name.splitlines()[0][:80] if name.splitlines() else name)
        value = env[name]
        if any(ch in name for ch in " \t\r\n") or name.startswith("#") or name.endswith("*"):
            return f"could not start: env name {shown} cannot go into podman's env file"
        if "\n" in value or "\r" in value:
            return f"could not start: a line break in env {shown}, which podman cannot pass"
        if len(f"{name}={value}".encode()) >= 64 * 1024:
            return f"could not start: env {shown} is over podman's 64 KiB per variable"
    return None


def write_env_file(path: Path, env: Mapping[str, str]) -> None:
    """`env` as an env file readable by the agent's user only (values may be secrets)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.writelines(f"{name}={value}\n" for name, value in sorted(env.items()))


def podman_failure(
    status: int | None, stderr: Path, program: str = "the command"
) -> tuple[int | None, str] | None:
    """The (exit status, reason) of a container run that never ran its command, read
    from the last line of its stderr; None for a command that ran and ended.

    podman's own errors (`Error: ...`, status 125 to 127) are passed on as they are.
    catatonit, which execs the command, exits 1 when it cannot: that becomes the
    shell's 127 (not found) or 126 (not executable), as for a process job.
    """
    if status not in PODMAN_STATUSES and status != 1:
        return None
    try:
        with stderr.open("rb") as handle:
            handle.seek(max(0, handle.seek(0, os.SEEK_END) - 4096))
            tail = handle.read().decode("utf-8", "replace").splitlines()
    except OSError:
        return None
    last = next((line for line in reversed(tail) if line.strip()), "")
    if status in PODMAN_STATUSES and last.startswith("Error: "):
        return status, f"podman: {last[len('Error: ') :].strip()}"[:500]
    found = _INIT_EXEC_FAILED.search(last)
    if status == 1 and found is not None:
        missing = "No such file" in found.group(1)
        return (127 if missing else 126), f"cannot run command: {program}: {found.group(1)}"[:500]
    return None


def container_of(pid: int) -> str | None:
    """The id of the podman container process `pid` runs in, or None."""
    try:
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return None
    found = _CONTAINER_IN_CGROUP.search(text)
    return found.group(1) if found else None


def cdi_gpus_declared(dirs: Sequence[Path] = CDI_DIRS) -> bool:
    """Whether a CDI spec declares the `nvidia.com/gpu` devices podman's `--device` needs."""
    for folder in dirs:
        for spec in sorted(folder.glob("*")) if folder.is_dir() else ():
            if spec.suffix not in (".yaml", ".yml", ".json"):
                continue
            try:
                text = spec.read_text(errors="replace")
            except OSError:
                continue
            if re.search(r"""kind["']?\s*:\s*["']?nvidia\.com/gpu""", text):
                return True
    return False


def container_launcher(
    podman: Podman, run: RunDir, action: Ensure, account: Account, env: Mapping[str, str]
) -> list[str]:
    """Write what a container run of `action` needs into its run folder (its name, its
    env file) and return the `podman run` the shim starts."""
    name = container_name(action.node, action.job_id, action.attempt, action.replica)
    program = action.spec.command[0]
    run.file(NAME_FILE).write_text(f"{name}\n{program if program.isprintable() else '?'}\n")
    write_env_file(run.file(ENV_FILE), env)
    assert action.spec.image is not None
    return podman.run_argv(
        name=name,
        run_dir=run.path,
        work=run.work,
        account=account,
        image=action.spec.image,
        command=action.spec.command,
        gpu_uuids=action.gpu_uuids,
        fractions=any(piece.milli < MILLI_PER_GPU for piece in action.slices),
        memory_mib=action.spec.memory_mib,
        cpu_milli=action.spec.cpu_milli,
        labels={
            "gpuloom.job": action.job_id,
            "gpuloom.attempt": str(action.attempt),
            "gpuloom.replica": str(action.replica),
        },
    )


def read_name(run: RunDir) -> str | None:
    """The container of a run folder's run; None for a process run."""
    return read_container_file(run)[0]


def read_container_file(run: RunDir) -> tuple[str | None, str]:
    """The container's name (None for a process run) and the program it runs."""
    try:
        lines = run.file(NAME_FILE).read_text().splitlines()
    except OSError:
        return None, ""
    return (lines[0] or None) if lines else None, lines[1] if len(lines) > 1 else "the command"


def read_container_id(run: RunDir) -> str | None:
    """The container's id, once podman has created it (`--cidfile`)."""
    try:
        return run.file(CID_FILE).read_text().strip() or None
    except OSError:
        return None


class ContainerError(RuntimeError):
    """`GPULOOM_AGENT_CONTAINERS=podman` and podman cannot be used."""


def find_podman(
    setting: str,
    pull: str,
    *,
    real_gpus: bool,
    environ: Mapping[str, str] = os.environ,
    cdi_dirs: Sequence[Path] = CDI_DIRS,
    run_dir: Path | None = None,
) -> Podman | None:
    """This node's podman, per `GPULOOM_AGENT_CONTAINERS` (auto, podman, off).

    A node with real GPUs needs a CDI spec of them too, or its image jobs would not
    see their GPUs; and the agent's `run_dir` must be a folder podman can mount (a
    `:` in it splits `--volume`). With `auto` a missing piece means no runtime (said
    in the log); with `podman` it raises ContainerError.
    """
    if setting == "off":
        return None
    path = shutil.which("podman", path=environ.get("PATH"))
    problem = None
    if run_dir is not None and ":" in str(run_dir):
        problem = (
            f"the agent's run folder {run_dir} has a ':', which podman's --volume takes "
            "for a separator: jobs' folders could not be mounted (GPULOOM_AGENT_RUN_DIR)"
        )
    elif path is None:
        problem = "podman is not installed (not on PATH)"
    else:
        try:
            subprocess.run(
                [path, "--version"], check=True, capture_output=True, timeout=30, env=environ
            )
        except (OSError, subprocess.SubprocessError) as exc:
            problem = f"`podman --version` failed: {exc}"
        else:
            problem = start_problem(path, environ)
    if problem is None and real_gpus and not cdi_gpus_declared(cdi_dirs):
        problem = (
            "no CDI spec declares nvidia.com/gpu (make one with "
            "`nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml`)"
        )
    if problem is not None:
        if setting == "podman":
            raise ContainerError(problem)
        log.info("jobs that name an image do not run here: %s", problem)
        return None
    assert path is not None
    return Podman(path, pull, real_gpus, podman_environ(environ))


def podman_environ(environ: Mapping[str, str]) -> dict[str, str]:
    """podman's own environment, from the agent's: a PATH and its configuration files."""
    own = {"PATH": environ.get("PATH") or "/usr/local/bin:/usr/bin:/bin"}
    own.update({name: environ[name] for name in PODMAN_ENV if name in environ})
    return own


#: The container `start_problem` starts: the host's own root, under an overlay that is
#: thrown away, as its filesystem (no image to pull), no network, nothing kept; the OCI
#: runtime does all it does for a job (namespaces, cgroup, mounts, rlimits), so what
#: would fail each job at its start fails here first.
PROBE = ("run", "--rm", "--network", "none", "--pids-limit", "64", "--rootfs", "/:O", "true")
PROBE_TIMEOUT_S = 60


def start_problem(path: str, environ: Mapping[str, str]) -> str | None:
    """Why podman cannot start a container on this host (the last line of what it said,
    with how to fix the cause seen most), or None: it started and ended one. A node only
    says it runs images (`runtimes`) when it can: otherwise each image job would fail at
    its start, one after another, on a node that looks able."""
    own = podman_environ(environ)
    try:
        done = subprocess.run(
            [path, *PROBE], capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env=own
        )
    except subprocess.TimeoutExpired:
        return f"podman did not start a container within {PROBE_TIMEOUT_S} s"
    except OSError as exc:
        return f"podman could not be run: {exc}"
    if done.returncode == 0:
        return None
    said = [line.strip() for line in done.stderr.splitlines() if line.strip()]
    last = said[-1] if said else f"exit status {done.returncode}"
    hint = ""
    if "rlimit" in last:
        hint = (
            " (this host forbids raising the default ulimits: set default_ulimits in "
            "containers.conf, docs/containers.md, and point CONTAINERS_CONF at it)"
        )
    elif "hybrid mode" in last:
        hint = " (crun and hybrid cgroups: use runc, docs/containers.md)"
    return f"podman cannot start a container here: {last[:300]}{hint}"


class Removals:
    """`podman rm -f` of containers whose runs the runner killed or saw end, and
    `podman kill --signal` of a checkpoint signal, each in a process of its own (the
    agent's loop never waits on podman), reaped by `reap`."""

    def __init__(self, podman: Podman) -> None:
        self.podman = podman
        self._running: list[subprocess.Popen[bytes]] = []

    def signal(self, name: str, number: int) -> None:
        """`podman kill --signal` of the container `name`: a job's checkpoint signal
        reaches the processes of its container, which are not in its shim's group."""
        self._spawn([self.podman.path, "kill", f"--signal={number}", name])

    def remove(self, name: str) -> None:
        self._spawn(self.podman.remove_argv(name))

    def _spawn(self, argv: list[str]) -> None:
        """Run podman with `argv` in a process of its own, reaped later."""
        try:
            self._running.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    env=dict(self.podman.environ),
                    start_new_session=True,
                )
            )
        except OSError as exc:  # the next end or kill of the run tries again
            log.warning("could not run %s: %s", " ".join(argv[1:]), exc)

    def reap(self) -> None:
        self._running = [proc for proc in self._running if proc.poll() is None]

    def pending(self) -> int:
        self.reap()
        return len(self._running)

"""A cgroup per job: every process it starts held, limited, and ended together.

As Slurm's proctrack/cgroup and task/cgroup: each attempt (and replica) of a job
gets `<base>/<node>/<job>-<attempt>[.rN]`, where `<base>` is the agent's own
cgroup plus `gpuloom` in each hierarchy (so whatever bounds the agent's service
bounds its jobs too). The shim's child writes itself into the group
(`cgroup.procs`) before it runs the job's command (`shim.SHIM`), so every
descendant is inside, `setsid` or not; the shim itself stays outside and records
the command's end.

* **cgroup v2** (a `cgroup2` mount at /sys/fs/cgroup with the memory and pids
  controllers): one folder; `memory.max`, `memory.swap.max`, `pids.max`,
  `cpu.max`; killed with `cgroup.kill`.
* **cgroup v1** (one mount per controller; hybrid hosts too): a folder in each of
  the memory, pids, cpu and freezer hierarchies; `memory.limit_in_bytes` (and
  `memsw`), `pids.max`, `cpu.cfs_quota_us`; killed by freezing the group,
  SIGKILLing every process in it, and thawing it.

Limits from the request (`limits_for`): memory `memory_mib` (none when 0), CPU a
quota of `cpu_milli` per 100 ms period (none when 0; at least the kernel's 1 ms),
`pids.max` from `agent_max_pids`. How a job ended is then read from its group: the
kernel's OOM kills (`oom_kills`) and refused forks (`pids_refused`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuloom.events import JobSpec
from gpuloom.events.units import MILLI_PER_CPU

MIB = 1024 * 1024
CPU_PERIOD_US = 100_000
#: The smallest CFS quota the kernel takes.
MIN_CPU_QUOTA_US = 1_000
DEFAULT_MAX_PIDS = 4096
#: v1 hierarchies a job's group spans; the first present of FREEZER, pids, memory lists it.
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
V2_CONTROLLERS = ("memory", "pids", "cpu")
#: The run-folder record of a job's group (its version, then its folders).
RECORD = "cgroup"
#: What a job can do without a cgroup, for the agent's start-up log.
UNCONFINED = (
    "a process a job starts outside its process group (setsid) outlives the job, and "
    "memory, CPU and the number of processes are not limited"
)
#: Characters a folder may not hold: the shim splits the list on spaces.
_UNSAFE = re.compile(r"[\s*?\[\]'\"\\$`]")


@dataclass(frozen=True, slots=True)
class Limits:
    """What a job's group allows; None: no limit."""

    memory_bytes: int | None = None
    cpu_quota_us: int | None = None
    pids: int | None = None

    @property
    def memory_mib(self) -> int:
        return (self.memory_bytes or 0) // MIB


def limits_for(spec: JobSpec, max_pids: int = DEFAULT_MAX_PIDS) -> Limits:
    """The limits of a job that asked `spec` (`max_pids` 0: no pids limit)."""
    memory = spec.memory_mib * MIB if spec.memory_mib > 0 else None
    cpu = None
    if spec.cpu_milli > 0:
        cpu = max(MIN_CPU_QUOTA_US, spec.cpu_milli * CPU_PERIOD_US // MILLI_PER_CPU)
    return Limits(memory, cpu, max_pids if max_pids > 0 else None)


def leaf_name(job_id: str, attempt: int, replica: int = 0) -> str:
    return f"{job_id}-{attempt}" + (f".r{replica}" if replica else "")


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def _count(text: str, key: str) -> int:
    """The number after `key` in a `key value` file (memory.events, pids.events)."""
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key and value.strip().isdigit():
            return int(value)
    return 0


def _write(path: Path, value: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)


@dataclass(frozen=True, slots=True)
class JobGroup:
    """One job's cgroup: one folder (v2), or one per hierarchy (v1, by controller)."""

    version: int
    dirs: tuple[tuple[str, Path], ...]
    limits: Limits = Limits()

    def dir(self, controller: str) -> Path | None:
        for name, path in self.dirs:
            if name == controller or self.version == 2:
                return path
        return None

    @property
    def folders(self) -> list[Path]:
        return [path for _, path in self.dirs]

    def lister(self) -> Path:
        """The folder whose `cgroup.procs` lists every process of the job."""
        for controller in ("freezer", "pids", "memory", "cpu"):
            found = self.dir(controller)
            if found is not None:
                return found
        raise ValueError("a job group without folders")

    def pids(self) -> list[int]:
        return [int(word) for word in _read(self.lister() / "cgroup.procs").split()]

    def create(self) -> None:
        """Make the folders and write the limits (raises OSError if it cannot)."""
        for _, path in self.dirs:
            path.mkdir(parents=True, exist_ok=True)
        limits = self.limits
        if self.version == 2:
            path = self.dirs[0][1]
            if limits.memory_bytes is not None:
                _write(path / "memory.max", str(limits.memory_bytes))
                with contextlib.suppress(OSError):  # no swap accounting
                    _write(path / "memory.swap.max", "0")
            if limits.pids is not None:
                _write(path / "pids.max", str(limits.pids))
            if limits.cpu_quota_us is not None and (path / "cpu.max").exists():
                _write(path / "cpu.max", f"{limits.cpu_quota_us} {CPU_PERIOD_US}")
            return
        memory, pids, cpu = self.dir("memory"), self.dir("pids"), self.dir("cpu")
        if memory is not None and limits.memory_bytes is not None:
            _write(memory / "memory.limit_in_bytes", str(limits.memory_bytes))
            with contextlib.suppress(OSError):  # no swap accounting (swapaccount=0)
                _write(memory / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
        if pids is not None and limits.pids is not None:
            _write(pids / "pids.max", str(limits.pids))
        if cpu is not None and limits.cpu_quota_us is not None:
            _write(cpu / "cpu.cfs_period_us", str(CPU_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", str(limits.cpu_quota_us))

    def kill(self) -> int:
        """SIGKILL every process in the group (forks made meanwhile too); how many.
        A group that is gone or empty costs one read."""
        if not self.pids():
            return 0
        if self.version == 2 and (self.lister() / "cgroup.kill").exists():
            _write(self.lister() / "cgroup.kill", "1")
            return 1
        freezer = self.dir("freezer") if self.version == 1 else None
        killed = 0
        try:
            if freezer is not None:
                _write(freezer / "freezer.state", "FROZEN")
                for _ in range(200):  # FREEZING until every task stopped
                    if _read(freezer / "freezer.state").strip() == "FROZEN":
                        break
                    time.sleep(0.001)
            for _ in range(100):  # without a freezer, forks race the kills
                found = self.pids()
                if not found:
                    break
                for pid in found:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                killed += len(found)
                if freezer is not None:
                    break
        finally:
            if freezer is not None:
                with contextlib.suppress(OSError):
                    _write(freezer / "freezer.state", "THAWED")
        return killed

    def remove(self) -> bool:
        """Remove the folders; False while a process (a dying one) is still inside."""
        gone = True
        for _, path in self.dirs:
            try:
                path.rmdir()
            except FileNotFoundError:
                continue
            except OSError as exc:
                if exc.errno not in (errno.EBUSY, errno.ENOTEMPTY):
                    raise
                gone = False
        return gone

    def oom_kills(self) -> int:
        """Processes the kernel killed for the group's memory limit."""
        memory = self.dir("memory")
        if memory is None:
            return 0
        if self.version == 2:
            return _count(_read(memory / "memory.events"), "oom_kill")
        return _count(_read(memory / "memory.oom_control"), "oom_kill")

    def pids_refused(self) -> int:
        """Forks the pids limit refused."""
        pids = self.dir("pids")
        return _count(_read(pids / "pids.events"), "max") if pids is not None else 0

    def record(self) -> str:
        """The run folder's record of the group (`read_record` reads it back)."""
        return "".join([f"{self.version}\n", *(f"{c} {p}\n" for c, p in self.dirs)])


def read_record(text: str, limits: Limits = Limits()) -> JobGroup | None:
    """The group a run folder's record names; None for none or a damaged record."""
    lines = text.splitlines()
    if not lines or lines[0] not in ("1", "2"):
        return None
    dirs = []
    for line in lines[1:]:
        controller, _, path = line.partition(" ")
        if not path.startswith("/"):
            return None
        dirs.append((controller, Path(path)))
    return JobGroup(int(lines[0]), tuple(dirs), limits) if dirs else None


@dataclass(frozen=True, slots=True)
class Cgroups:
    """Where this node's job groups live (by controller; v2: one, named "")."""

    version: int
    bases: tuple[tuple[str, Path], ...]
    max_pids: int = DEFAULT_MAX_PIDS

    def group(self, node: str, job_id: str, attempt: int, replica: int, spec: JobSpec) -> JobGroup:
        """The group of one run (its folders are made by `JobGroup.create`)."""
        leaf = leaf_name(job_id, attempt, replica)
        dirs = tuple((name, base / node / leaf) for name, base in self.bases)
        return JobGroup(self.version, dirs, limits_for(spec, self.max_pids))

    def describe(self) -> str:
        where = ", ".join(str(base) for _, base in self.bases)
        names = "memory, pids, cpu" if self.version == 2 else ", ".join(n for n, _ in self.bases)
        pids = f"pids.max {self.max_pids}" if self.max_pids else "no pids limit"
        return (
            f"cgroup v{self.version} ({names}) under {where}: every process of a job is held "
            f"and ended with it; memory from memory_mib, CPU from cpu_milli, {pids}"
        )


def _mounts(text: str) -> list[tuple[Path, str, set[str]]]:
    """(mount point, type, options) of the cgroup mounts in /proc/self/mounts."""
    found = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[2] in ("cgroup", "cgroup2"):
            found.append((Path(fields[1]), fields[2], set(fields[3].split(","))))
    return found


def _own_paths(text: str) -> dict[str, str]:
    """The agent's cgroup by controller (v2's under "") from /proc/self/cgroup."""
    paths = {}
    for line in text.splitlines():
        _, controllers, path = ([*line.split(":", 2), "", ""])[:3]
        for name in controllers.split(",") if controllers else [""]:
            paths[name] = path
    return paths


def detect(
    max_pids: int = DEFAULT_MAX_PIDS,
    mounts: str | None = None,
    own: str | None = None,
) -> tuple[Cgroups | None, str]:
    """This host's job groups, or None with why not (not root, no controllers)."""
    if os.geteuid() != 0:
        return None, "the agent is not root"
    mounts = _read(Path("/proc/self/mounts")) if mounts is None else mounts
    own_paths = _own_paths(_read(Path("/proc/self/cgroup")) if own is None else own)
    found = _mounts(mounts)
    for point, kind, _ in found:
        controllers = set(_read(point / "cgroup.controllers").split())
        if kind == "cgroup2" and {"memory", "pids"} <= controllers:
            base = point / own_paths.get("", "/").lstrip("/") / "gpuloom"
            problem = _delegate_v2(point, base, controllers)
            if problem is not None:
                return None, problem
            return _checked(Cgroups(2, (("", base),), max_pids))
    bases = []
    for controller in V1_CONTROLLERS:
        for point, kind, options in found:
            if kind == "cgroup" and controller in options:
                own_path = own_paths.get(controller, "/").lstrip("/")
                bases.append((controller, point / own_path / "gpuloom"))
                break
    if not any(name in ("freezer", "pids") for name, _ in bases):
        return None, "no cgroup v2 with memory and pids, nor v1 freezer or pids hierarchy"
    return _checked(Cgroups(1, tuple(bases), max_pids))


def _checked(cgroups: Cgroups) -> tuple[Cgroups | None, str]:
    for _, base in cgroups.bases:
        if _UNSAFE.search(str(base)):
            return None, f"cgroup folder {str(base)!r} has a character the shim cannot take"
        try:
            base.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            return None, f"cannot make {base}: {exc.strerror}"
    return cgroups, cgroups.describe()


def _delegate_v2(point: Path, base: Path, controllers: Iterable[str]) -> str | None:
    """Enable the controllers from the agent's cgroup down to `base` (v2 allows them
    only in a cgroup without processes: the agent moves itself into `<own>/agent`)."""
    wanted = " ".join(f"+{c}" for c in V2_CONTROLLERS if c in set(controllers))
    own = base.parent
    try:
        if own != point and _read(own / "cgroup.procs").split():
            (own / "agent").mkdir(exist_ok=True)
            for pid in _read(own / "cgroup.procs").split():
                with contextlib.suppress(ProcessLookupError, OSError):
                    _write(own / "agent" / "cgroup.procs", pid)
        _write(own / "cgroup.subtree_control", wanted)
        base.mkdir(exist_ok=True)
        _write(base / "cgroup.subtree_control", wanted)
    except OSError as exc:
        return f"cgroup v2: cannot enable {wanted} under {own}: {exc.strerror}"
    return None


def enable_node(cgroups: Cgroups, node: str) -> None:
    """Make a node's folder (v2: with the controllers enabled for its jobs)."""
    for _, base in cgroups.bases:
        (base / node).mkdir(parents=True, exist_ok=True)
        if cgroups.version == 2:
            for controller in V2_CONTROLLERS:
                with contextlib.suppress(OSError):  # cpu may be unavailable
                    _write(base / node / "cgroup.subtree_control", f"+{controller}")


def hidden_processes(mounts: str | None = None) -> str:
    """Whether /proc hides other users' processes (hidepid), for the start-up log."""
    mounts = _read(Path("/proc/self/mounts")) if mounts is None else mounts
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[1] == "/proc" and fields[2] == "proc":
            options = fields[3].split(",")
            if {"hidepid=2", "hidepid=invisible"} & set(options):
                return "/proc hides other users' processes (hidepid)"
    return (
        "/proc shows every user's processes and their command lines (not their "
        "environments): mount it with hidepid=invisible to hide them (docs/operations.md)"
    )

"""A job process the runner holds, and how it is stopped and seen to end.

A job that asked for a checkpoint signal (`JobSpec.signal`, sbatch's `--signal`) gets
it first, on its own processes (never the shim's), `before_s` seconds before its time
limit or before a stop for a preemption or a failed GPU; a user's cancel stops it at
once. A stop then escalates in steps, each after a grace period: SIGTERM to the shim (which
TERMs the job's group), then SIGUSR1 (the shim SIGKILLs the command and records its
status), then SIGKILL of the whole group and of the job's cgroup. The runner (`services.agent.runner`)
decides when to stop a job; this module carries the steps out and tells when the
shim has ended: by `waitid` for its own children, by the `exit` file or the shim's
death for one adopted after a restart. Once the shim has ended, whatever is left
of the job is killed: its process group and, where the job has one, its cgroup
(`services.agent.cgroups`), which also holds what left the group (`setsid`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gpuloom.events import JobSpec
from services.agent.cgroups import JobGroup
from services.agent.reconcile import Status
from services.agent.rendezvous import Master
from services.agent.shim import RunDir

#: How often the liveness of an adopted shim is checked (its `exit` file, every poll).
LIVENESS_EVERY_S = 1.0


@dataclass
class Proc:
    node: str
    run: RunDir
    pid: int
    #: A child of this process (reaped with waitpid), not a shim adopted after a restart.
    own: bool
    status: Status
    time_limit_s: int | None = None
    #: time.monotonic() when the time limit expires, or the next stop escalation is due.
    deadline: float | None = None
    #: Stop steps taken: 0 none (yet), 1 SIGTERM sent, 2 command SIGKILLed, 3 group SIGKILLed.
    stage: int = 0
    #: time.monotonic() of the last liveness check of an adopted shim.
    alive_checked: float = 0.0
    #: GPU memory (MiB) the job's slices allow, by local GPU uuid (fractions only).
    memory_limits: dict[str, int] = field(default_factory=dict)
    #: This stop's grace between steps, when shorter than the runner's (a fence).
    grace_s: float | None = None
    #: Replica 0 of a gang: the rendezvous reserved for it (`services.agent.rendezvous`).
    master: Master | None = None
    #: The container of a job that names an image (`services.agent.containers`).
    container: str | None = None
    #: The job's cgroup (None: the host has none for it, or an older agent started it).
    cgroup: JobGroup | None = None
    #: The checkpoint signal the job asked for (`JobSpec.signal`): its number and how
    #: many seconds before a stop it comes; None: none.
    checkpoint: tuple[int, int] | None = None
    #: The checkpoint signal was sent (before the time limit, or a stop): never twice.
    warned: bool = False


def checkpoint_of(spec: JobSpec) -> tuple[int, int] | None:
    """The job's checkpoint signal as (signal number, seconds before), or None."""
    if spec.signal is None:
        return None
    return int(getattr(signal, f"SIG{spec.signal.name}")), spec.signal.before_s


def job_pids(proc: Proc) -> list[int]:
    """The job's own processes, never its shim: every process of its cgroup (where it
    has one: the shim stays outside), else every process of the shim's group but the
    shim (a process that left the group with setsid is then not reached)."""
    if proc.cgroup is not None:
        with contextlib.suppress(OSError):
            return proc.cgroup.pids()
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == proc.pid:
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == proc.pid:  # the process group, after state and parent
            pids.append(int(entry))
    return pids


#: The run folder's mark that the job had its checkpoint signal: an agent restarted
#: after it adopts the job without sending it again.
WARNED = "warned"


def warn(proc: Proc, signal_job: Callable[[Proc, int], None]) -> None:
    """Send the job its checkpoint signal, once (`signal_job` reaches a container), and
    mark the run folder so (`WARNED`), for an agent that adopts the job after a restart."""
    if proc.checkpoint is None or proc.warned:
        return
    proc.warned = True
    with contextlib.suppress(OSError):  # the signal matters more than the mark
        proc.run.file(WARNED).touch()
    number = proc.checkpoint[0]
    if proc.container is not None:
        signal_job(proc, number)
        return
    for pid in job_pids(proc):
        send(pid, number)


def send(pid: int, sig: int, *, group: bool = False) -> None:
    """Signal the process (or its group); one that is gone or not ours is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)


def warn_then_terminate(
    proc: Proc, grace_s: float, signal_job: Callable[[Proc, int], None], most_s: float
) -> None:
    """A stop of a job that asked for a checkpoint signal and has not had it: the
    signal now, SIGTERM `before_s` later, at most `most_s` (its escalation, stage 0);
    else SIGTERM now."""
    if proc.checkpoint is None or proc.warned or most_s <= 0:
        terminate(proc, grace_s)
        return
    warn(proc, signal_job)
    proc.stage, proc.deadline = 0, time.monotonic() + min(proc.checkpoint[1], most_s)


def terminate(proc: Proc, grace_s: float) -> None:
    """SIGTERM the shim (which TERMs its group) once its traps are set and its
    child started: it writes `pid` then. Until then, try again at the next poll."""
    if proc.run.read_pid() is None:
        proc.stage, proc.deadline = 0, time.monotonic()
        return
    proc.stage = 1
    proc.deadline = time.monotonic() + grace_s
    send(proc.pid, signal.SIGTERM)


def escalate_stop(proc: Proc, grace_s: float, remove_container: Callable[[Proc], None]) -> None:
    """The next step of a stop whose grace ran out (see the module doc)."""
    if proc.stage == 0:
        terminate(proc, grace_s)
    elif proc.stage == 1:
        proc.stage, proc.deadline = 2, time.monotonic() + grace_s
        remove_container(proc)  # outside the group: podman kills it
        send(proc.pid, signal.SIGUSR1)  # the shim SIGKILLs the command
    elif proc.stage == 2:
        proc.stage, proc.deadline = 3, None
        send(proc.pid, signal.SIGKILL, group=True)
        sweep(proc)
        remove_container(proc)


def sweep(proc: Proc) -> None:
    """SIGKILL every process left in the job's cgroup (none without one)."""
    if proc.cgroup is not None:
        with contextlib.suppress(OSError):  # already removed
            proc.cgroup.kill()


def has_ended(proc: Proc) -> bool:
    """Whether the shim has ended (its group and cgroup are SIGKILLed then: nothing
    outlives it)."""
    if proc.own:
        try:
            info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            sweep(proc)
            return True
        if info is None:
            return False
        # The shim is a zombie: its pid (the group id) cannot be reused yet.
        send(proc.pid, signal.SIGKILL, group=True)
        sweep(proc)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(proc.pid, 0)
        return True
    # Not our child (adopted after a restart): its `exit` file tells, or its death.
    if not proc.run.has_exit():
        now = time.monotonic()
        if now < proc.alive_checked + LIVENESS_EVERY_S:
            return False
        proc.alive_checked = now
        if proc.run.shim_alive(proc.pid):
            return False
    if proc.status in (Status.STOPPING, Status.DROPPING):
        send(proc.pid, signal.SIGKILL, group=True)
    sweep(proc)
    return True

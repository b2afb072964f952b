"""The per-job `/bin/sh` shim, its run folder, and how a run's end is read back.

Each attempt of a job runs in `<run root>/<node>/<job_id>/<attempt>/`:

| file     | written by | content                                                   |
| -------- | ---------- | --------------------------------------------------------- |
| `stdout` | the job    | the job's standard output (made by the agent, mode 0600,  |
|          |            | the job's account's: see `starting.give_logs`)            |
| `stderr` | the job    | the job's standard error (and the shim's own messages)    |
| `pid`    | the shim   | the shim's pid, which is also the job's process group id  |
| `exit`   | the shim   | the command's exit status as the shell reports it (`$?`)  |
|          |            | and a newline, in one write: final once the newline is    |
|          |            | there; its mtime is when the command ended (`exit_time`)  |
| `reason` | the agent  | why the agent stopped the job, written before signalling: |
|          |            | line 1 the outcome (`timed_out`, `cancelled`), line 2 text|
| `launch` | the agent  | what starts the job as its account (`starting`): a shell |
|          |            | script fed to `/bin/sh -s`, or `launch.py`'s file; mode   |
|          |            | 0600; removed once the run ended                          |
| `container`, `cid`, `env` | the agent, podman | an image job's container: its |
|          |            | name, its id, its env file (`containers`)                 |
| `work/`  | the job    | the job's own working directory and HOME: owned by the    |
|          |            | job's account, mode 0700                                  |

The folder and the records in it belong to the agent's user: the job, which runs
as an unprivileged account (see `identity`), cannot forge its records nor touch
another job's. Only `work/` and the two logs are the job's account's.

The shim is started by the agent in a new session (so a new process group whose
id is the shim's pid), as the agent's user with a clean environment, and
outlives the agent. It enters `work/` and runs what `starting` chose as its child
in the same group (setpriv and a script on its fd 3, or `launch.py`; for an image,
`podman run`), which becomes the command (as the job's account, with the job's
environment), and waits for it. Its traps give the agent two levers that never hit the shim itself:

* SIGTERM to the shim: the shim sends SIGTERM once to its whole process group
  (the job and everything the job started); its own copy is ignored.
* SIGUSR1 to the shim: the shim SIGKILLs the command, then records its status.

So a cancelled or timed-out job still gets an `exit` file; the agent sweeps what
is left of the group with SIGKILL after the shim is gone.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from gpuloom.events import Outcome

SHIM = r"""cd "$1" || exit 125
g=$2
shift 2
t=
i=
trap 'i=1; if [ -z "$t" ]; then t=1; kill -TERM 0 2>/dev/null; fi' TERM
trap 'i=1; kill -KILL "$c" 2>/dev/null' USR1
(for d in $g; do echo 0 >"$d/cgroup.procs" || exit 125; done; cd work && exec "$@") <&3 3<&- &
c=$!
exec 3<&-
echo $$ >pid
while :; do
  i=
  wait "$c"
  s=$?
  [ -n "$i" ] || break
  kill -0 "$c" 2>/dev/null && continue
  wait "$c"
  r=$?
  [ "$r" -ne 127 ] && s=$r
  break
done
echo "$s" >exit
"""
# `$2`: the job's cgroup folders, separated by spaces (`services.agent.cgroups`), or
# nothing. The child writes itself (`0`: the writer) into each before it runs
# anything of the job's, so every process the job starts is inside; it refuses to
# run the job (exit 125) if it cannot enter one. The shim stays outside.
# `pid` is written once the child exists: the agent signals the shim only after it
# reads `pid`, so a TERM (a cancel right after the start) always finds the child in
# the group. Written before, a TERM could come while there was none to pass it to.
# The loop: a trap interrupts `wait` with a status > 128 that is not the child's.
# After a trap, wait again while the child exists; once it is gone, `wait` gives
# its real status, or 127 if the first `wait` had already collected it.
# `exit` is written in place, not renamed from a temporary file: a `mv` was a process
# of its own for every job (the builtin `echo` writes the status and its newline in
# one write(2)). A reader takes the file as final only with its newline
# (`RunDir.read_exit`): one read between the shell's open and its write sees nothing.

#: Signals the agent process may ignore or handle that a job must see at default.
_DEFAULT_SIGNALS = frozenset(
    {
        signal.SIGPIPE,
        signal.SIGXFSZ,
        signal.SIGINT,
        signal.SIGTERM,
        signal.SIGHUP,
        signal.SIGQUIT,
        signal.SIGUSR1,
        signal.SIGUSR2,
        signal.SIGCHLD,
    }
)
SHIM_ARGV0 = "gpuloom-shim"
#: The program the shim runs, which becomes the job's command (see its docstring).
LAUNCHER = str(Path(__file__).with_name("launch.py"))
#: The shim's own environment: nothing of the job's reaches a process of the agent's user.
SHIM_ENV = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


@dataclass(frozen=True, slots=True)
class Ended:
    """How a run ended, as read from its run folder."""

    outcome: Outcome
    exit_code: int | None
    reason: str | None
    #: When the command ended, by the node's clock (the `exit` file's mtime); None
    #: when nobody saw it end. Reported as `JobFinished.ended_at`, so the run is
    #: charged up to its end, not up to when the agent got round to reporting it.
    #: Not part of equality: the same end read twice is the same end.
    at: datetime | None = field(default=None, compare=False)


def parse_run_leaf(name: str) -> tuple[int, int] | None:
    """(attempt, replica) of a run folder's name (`3`, `3.r1`), None for anything else."""
    attempt, _, replica = name.partition(".r")
    if not attempt.isdigit() or (replica and not replica.isdigit()):
        return None
    return int(attempt), int(replica or 0)


class RunDir:
    """The run folder of one attempt of one job on one node."""

    def __init__(self, root: Path, node: str, job_id: str, attempt: int, replica: int = 0) -> None:
        # replica 0 keeps the plain attempt folder (what `gpuloom logs` reads)
        leaf = str(attempt) if replica == 0 else f"{attempt}.r{replica}"
        self.path = root / node / job_id / leaf

    def file(self, name: str) -> Path:
        return self.path / name

    @property
    def work(self) -> Path:
        """The job's own working directory (and HOME)."""
        return self.path / "work"

    def exists(self) -> bool:
        return self.path.is_dir()

    def was_spawned(self) -> bool:
        """Whether a shim was ever spawned here (spawning creates `stdout` first)."""
        return self.file("stdout").exists() or self.file("pid").exists()

    def create(self, gid: int | None = None) -> None:
        """Make the folder. The folders above it (node, job) can be passed through but
        not listed (0711); the folder itself is the agent's, open to the job's group
        only (0710, group `gid`: the job reaches its `work/` and HOME, other users'
        jobs cannot enter); 0700 when `gid` is None (an agent that is not root)."""
        self.path.mkdir(parents=True, exist_ok=True)
        for folder in (self.path.parent.parent, self.path.parent):
            os.chmod(folder, 0o711)
        if gid is None:
            os.chmod(self.path, 0o700)
            return
        os.chown(self.path, -1, gid)
        os.chmod(self.path, 0o710)

    def read_pid(self) -> int | None:
        """The shim's pid; None if not (yet) written. Tolerates a half-written file."""
        try:
            return int(self.file("pid").read_text().strip())
        except (OSError, ValueError):
            return None

    def started_wall(self) -> float | None:
        """When the shim started (the `pid` file's mtime), seconds since the epoch."""
        try:
            return self.file("pid").stat().st_mtime
        except OSError:
            return None

    def has_exit(self) -> bool:
        return self.read_exit() is not None

    def exit_time(self) -> datetime | None:
        """When the command ended: the mtime of the `exit` file, None while it runs.

        The shim writes `exit` right after `wait` returns, so the kernel stamps the
        file with the moment the shim saw the command end. POSIX sh has no clock of
        its own, and a `date` process would depend on the job's PATH; the file's own
        time needs neither.
        """
        try:
            return datetime.fromtimestamp(self.file("exit").stat().st_mtime, UTC)
        except OSError:
            return None

    def read_exit(self) -> int | None:
        """The command's exit status, or None while it runs (or if the shim died):
        only a status with its newline is final (the shim writes both at once)."""
        try:
            text = self.file("exit").read_text()
            return int(text) if text.endswith("\n") else None
        except (OSError, ValueError):
            return None

    def write_reason(self, outcome: Outcome, text: str) -> None:
        tmp = self.file("reason.tmp")
        tmp.write_text(f"{outcome}\n{text}\n")
        tmp.replace(self.file("reason"))

    def read_reason(self) -> tuple[str, str] | None:
        try:
            lines = self.file("reason").read_text().splitlines()
        except OSError:
            return None
        if not lines:
            return None
        return lines[0], (lines[1] if len(lines) > 1 else lines[0])

    def shim_alive(self, pid: int) -> bool:
        """Whether `pid` is a live shim of this run folder (not a recycled pid)."""
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return False  # another user's process: a recycled pid
        try:
            args = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            return not Path("/proc/self").exists()  # no procfs: trust kill(0)
        except OSError:
            return False
        if _proc_state(pid) == "Z":
            return False
        return SHIM_ARGV0.encode() in args and os.fsencode(str(self.path)) in args


def _proc_state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return ""
    return stat.rsplit(")", 1)[-1].split()[0] if ")" in stat else ""


def describe_status(status: int) -> str:
    """`3` -> `exit code 3`; `137` -> `killed by signal 9` (the shell's 128+N)."""
    if 128 < status < 128 + 65:
        return f"killed by signal {status - 128}"
    return f"exit code {status}"


def ended(status: int | None, reason: tuple[str, str] | None, at: datetime | None = None) -> Ended:
    """The outcome of a run from its exit status and the agent's reason file.

    A reason file (the agent stopped the job) decides the outcome; otherwise exit
    status 0 is success and anything else a failure. No status and no reason
    means nobody knows how the command ended: the agent lost it (and `at`, when
    the command ended, is then unknown too).
    """
    if reason is not None and reason[0] == "timed_out":
        return Ended("timed_out", status, reason[1], at)
    if reason is not None and reason[0] == "cancelled":
        return Ended("cancelled", status, reason[1], at)
    if reason is not None and reason[0] == "preempted":
        return Ended("preempted", status, reason[1], at)
    if reason is not None and reason[0] == "failed":  # e.g. GpuMemoryExceeded
        return Ended("failed", status, reason[1], at)
    if status is None:
        return Ended("failed", None, "agent lost the process")
    if status == 0:
        return Ended("succeeded", 0, None, at)
    return Ended("failed", status, describe_status(status), at)


def spawn_shim(
    run: RunDir,
    launcher: Sequence[str],
    shim_env: Mapping[str, str] = SHIM_ENV,
    stdin: str = os.devnull,
    cgroups: Sequence[Path] = (),
) -> int:
    """Start the shim in `run` (created beforehand, with its `work` folder) running
    `launcher` (`services.agent.starting`, or a container's `podman run`) with its
    standard input from `stdin` (a file the agent's user opens), inside the cgroup
    folders `cgroups` (made beforehand); return its pid.

    The shim gets a new session, stdin from /dev/null, stdout and stderr on the run
    folder's files, `shim_env` (never the job's own), default signal dispositions
    and an empty signal mask. Raises OSError if the shim cannot be spawned.
    """
    append = os.O_WRONLY | os.O_CREAT | os.O_APPEND
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 3, stdin, os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, str(run.file("stdout")), append, 0o600),
        (os.POSIX_SPAWN_OPEN, 2, str(run.file("stderr")), append, 0o600),
    ]
    folders = " ".join(str(path) for path in cgroups)
    argv = ["/bin/sh", "-c", SHIM, SHIM_ARGV0, str(run.path), folders, *launcher]
    return os.posix_spawn(
        "/bin/sh",
        argv,
        dict(shim_env),
        file_actions=actions,
        setsid=True,
        setsigdef=_DEFAULT_SIGNALS,
        setsigmask=(),
    )

"""Start one job's command as its account; run by the shim as `python -I -S launch.py FILE`.

Standalone (the standard library only; the agent imports only `encode`): the shim
starts it with a clean environment, as the agent's user (root, usually), in the
run folder. It reads then deletes the launch file FILE (written by the agent,
mode 0600: see `encode`), enters the
job's working directory, gives the job its log files (its stdout and stderr, as
Slurm's output files are the user's), drops to the account (groups, then gid,
then uid) and
refuses to go on if any of its ids is still root's, restores the signals Python
changed at start, and executes the command with the job's own environment.

So the job's environment (which may set `LD_LIBRARY_PATH`, say) only ever
reaches a process that runs as the job's account. A command that cannot be
executed exits as the shell's would: 127 not found, 126 not executable.

It runs once per job, so it imports nothing beyond what Python loads at start:
the launch file is NUL-separated words (argv and env hold no NUL: the agent
checks), not JSON, whose decoder pulls in `re` and `enum`: importing them was a
large part of the CPU a job's start costs.
"""

from __future__ import annotations

import _signal as signal  # not `signal`, which imports enum (for every job)
import errno
import os
import sys

DEFAULT_PATH = b"/usr/local/bin:/usr/bin:/bin"
#: The first word of a launch file: its format.
MAGIC = b"gpuloom-launch-1"


class Launch:
    """What one launch file says: run `argv` with `env` as `uid`/`gid`/`groups` in `cwd`."""

    def __init__(
        self,
        argv: list[bytes],
        env: dict[bytes, bytes],
        uid: int,
        gid: int,
        groups: list[int],
        cwd: bytes,
    ) -> None:
        self.argv, self.env, self.uid, self.gid = argv, env, uid, gid
        self.groups, self.cwd = groups, cwd


def encode(launch: Launch) -> bytes:
    """The launch file: MAGIC, uid, gid, groups (comma-separated), cwd, the number of
    argv words, the number of env entries, the argv words, then `NAME=value` entries,
    all separated by NUL bytes."""
    words = [
        MAGIC,
        b"%d" % launch.uid,
        b"%d" % launch.gid,
        b",".join(b"%d" % group for group in launch.groups),
        launch.cwd,
        b"%d" % len(launch.argv),
        b"%d" % len(launch.env),
        *launch.argv,
        *(name + b"=" + value for name, value in launch.env.items()),
    ]
    return b"\0".join(words)


def decode(data: bytes) -> Launch:
    """The Launch of a launch file (`encode`); ValueError for anything else."""
    words = data.split(b"\0")
    if len(words) < 7 or words[0] != MAGIC:
        raise ValueError("not a gpuloom launch file")
    argc, envc = int(words[5]), int(words[6])
    if argc < 1 or len(words) != 7 + argc + envc:
        raise ValueError("a launch file with the wrong number of words")
    env = {}
    for entry in words[7 + argc :]:
        name, _, value = entry.partition(b"=")
        env[name] = value
    groups = [int(group) for group in words[3].split(b",") if group]
    return Launch(words[7 : 7 + argc], env, int(words[1]), int(words[2]), groups, words[4])


def find(program: bytes, path: bytes) -> bytes | None:
    """The file `execvp` would run for `program`, searching `path`; None if not found."""
    if b"/" in program:
        return program
    found = None
    for folder in path.split(b":"):
        candidate = os.path.join(folder or b".", program)
        if os.path.isfile(candidate):
            if os.access(candidate, os.X_OK):
                return candidate
            found = found or candidate  # exists but not executable: 126, as the shell
    return found


def drop(uid: int, gid: int, groups: list[int]) -> None:
    """Become `uid`/`gid` with `groups` for good (a no-op when already them)."""
    if (os.getuid(), os.geteuid()) != (uid, uid) or os.getgid() != gid:
        os.setgroups(groups)
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)
    if 0 in os.getresuid():
        raise PermissionError(errno.EPERM, "refusing to run a job as root")


def main(launch_file: str) -> int:
    with open(launch_file, "rb") as handle:
        spec = decode(handle.read())
    os.unlink(launch_file)
    argv, env, name = spec.argv, spec.env, os.fsdecode(spec.argv[0])
    try:
        os.chdir(spec.cwd)
        if os.geteuid() == 0:  # the logs are the job's own: `> /dev/stderr` reopens them
            for fd in (1, 2):
                os.fchown(fd, spec.uid, spec.gid)
        drop(spec.uid, spec.gid, spec.groups)
    except OSError as exc:
        sys.stderr.write(f"gpuloom: cannot start the job as uid {spec.uid}: {exc}\n")
        return 126
    for number in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a job must not
        signal.signal(number, signal.SIG_DFL)
    program = find(argv[0], env.get(b"PATH", DEFAULT_PATH))
    if program is None:
        sys.stderr.write(f"gpuloom: {name}: command not found\n")
        return 127
    try:
        os.execve(program, argv, env)
    except OSError as exc:
        if exc.errno != errno.ENOEXEC:
            sys.stderr.write(f"gpuloom: {name}: {exc.strerror}\n")
            return 127 if exc.errno == errno.ENOENT else 126
    try:  # no `#!` line: a shell script, as the shell (and execvp) would run it
        os.execve(b"/bin/sh", [b"/bin/sh", program, *argv[1:]], env)
    except OSError as exc:
        sys.stderr.write(f"gpuloom: {name}: {exc.strerror}\n")
    return 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

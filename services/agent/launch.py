"""Start one job's command as its account; run by the shim as `python -I -S launch.py FILE`.

Standalone (the standard library only, never imported by the agent): the shim
starts it with a clean environment, as the agent's user (root, usually), in the
run folder. It reads then deletes the launch file FILE (JSON written by the
agent, mode 0600: `argv`, `env`, `uid`, `gid`, `groups`, `cwd`), enters the
job's working directory, gives the job its log files (its stdout and stderr, as
Slurm's output files are the user's), drops to the account (groups, then gid,
then uid) and
refuses to go on if any of its ids is still root's, restores the signals Python
changed at start, and executes the command with the job's own environment.

So the job's environment (which may set `LD_LIBRARY_PATH`, say) only ever
reaches a process that runs as the job's account. A command that cannot be
executed exits as the shell's would: 127 not found, 126 not executable.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import sys

DEFAULT_PATH = "/usr/local/bin:/usr/bin:/bin"


def find(program: str, path: str) -> str | None:
    """The file `execvp` would run for `program`, searching `path`; None if not found."""
    if "/" in program:
        return program
    found = None
    for folder in path.split(os.pathsep):
        candidate = os.path.join(folder or ".", program)
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
        spec = json.load(handle)
    os.unlink(launch_file)
    argv: list[str] = spec["argv"]
    env: dict[str, str] = spec["env"]
    try:
        os.chdir(spec["cwd"])
        if os.geteuid() == 0:  # the logs are the job's own: `> /dev/stderr` reopens them
            for fd in (1, 2):
                os.fchown(fd, spec["uid"], spec["gid"])
        drop(spec["uid"], spec["gid"], spec["groups"])
    except OSError as exc:
        sys.stderr.write(f"gpuloom: cannot start the job as uid {spec['uid']}: {exc}\n")
        return 126
    for number in (signal.SIGPIPE, signal.SIGXFSZ):  # Python ignores them; a job must not
        signal.signal(number, signal.SIG_DFL)
    program = find(argv[0], env.get("PATH", DEFAULT_PATH))
    if program is None:
        sys.stderr.write(f"gpuloom: {argv[0]}: command not found\n")
        return 127
    try:
        os.execve(program, argv, env)
    except OSError as exc:
        if exc.errno != errno.ENOEXEC:
            sys.stderr.write(f"gpuloom: {argv[0]}: {exc.strerror}\n")
            return 127 if exc.errno == errno.ENOENT else 126
    try:  # no `#!` line: a shell script, as the shell (and execvp) would run it
        os.execve("/bin/sh", ["/bin/sh", program, *argv[1:]], env)
    except OSError as exc:
        sys.stderr.write(f"gpuloom: {argv[0]}: {exc.strerror}\n")
    return 126


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))

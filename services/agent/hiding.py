"""Each process job sees only its own user's processes in `/proc` (docs/operations.md).

Jobs of different users run as different uids (`identity`), so the kernel already
refuses one job another's `/proc/<pid>/environ`, but `/proc/<pid>/cmdline` (argv)
and the list of processes are open to every user. Where the host's `/proc` is not
mounted with `hidepid` already, each process job starts in a mount namespace of its
own (`unshare --mount --propagation slave`: the host's later mounts still reach
it) with a `/proc` of its own mounted `hidepid=2`, before it switches to the job's
account: the job sees its own user's processes only. That costs CPU for every
started job (an `unshare` and a `mount`), so it is skipped where the host
already hides them. A `/proc` instance with options of its own needs Linux 5.8;
on an older kernel the mount would change the host's `/proc`, so nothing is done.
Image jobs get their own PID namespace from podman instead.
"""

from __future__ import annotations

import os
import shutil
import subprocess

from services.agent.cgroups import hidden_processes

_PATH = "/usr/bin:/bin:/usr/sbin:/sbin"
#: What runs as root inside the new mount namespace, then execs the job's start.
HIDE = 'mount -t proc -o hidepid=2,nosuid,nodev,noexec proc /proc || exit 125; exec "$@"'


def prefix(unshare: str) -> list[str]:
    """What the shim runs in front of a process job's start (see the module doc)."""
    return [unshare, "--mount", "--propagation", "slave", "/bin/sh", "-c", HIDE, "gpuloom-hide"]


def _kernel_at_least(major: int, minor: int) -> bool:
    try:
        found = tuple(int(part) for part in os.uname().release.split("-")[0].split(".")[:2])
    except ValueError:
        return False
    return found >= (major, minor)


def process_hiding(setting: str = "auto") -> tuple[list[str], str]:
    """The prefix that hides other users' processes from a job (empty: none is
    needed, none works here, or `setting` is `off`), and what it means, for the
    start-up log."""
    already = hidden_processes()
    if "hides" in already:
        return [], already
    if setting == "off":
        return [], f"{already}; GPULOOM_AGENT_HIDE_PROCESSES=off: jobs see other users' argv"
    unshare = shutil.which("unshare", path=_PATH)
    if os.geteuid() != 0 or unshare is None or not _kernel_at_least(5, 8):
        return [], f"{already}; the agent cannot hide them per job (needs root, unshare, Linux 5.8)"
    argv = [*prefix(unshare), "true"]
    try:
        tried = subprocess.run(argv, capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return [], f"{already}; hiding them per job failed: {exc}"
    if tried.returncode != 0:
        problem = tried.stderr.decode(errors="replace").strip()
        return [], f"{already}; hiding them per job failed: {problem}"
    return prefix(unshare), "each process job gets a /proc of its own that hides other users"

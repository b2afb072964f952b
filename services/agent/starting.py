"""How a process job's command starts as its account, with its environment.

The shim runs as the agent's user (root) with a clean environment. What it starts
must switch to the job's account and only then take the job's environment, so that
nothing of the job's (its `LD_PRELOAD`, say) reaches a process of root's. Two ways,
the first whenever it can:

* **setpriv and a script** (the cheaper: no interpreter starts): util-linux's `setpriv` switches
  groups, gid and uid, then execs `/bin/sh -s`, which reads from its standard input
  a script the agent wrote to the run folder's `launch` file (mode 0600, root's: the
  shim opens it before the switch, so the job's account never needs to read it). The
  shim has entered the job's working directory as root, so the folders above it need
  not be open to the job. The script sets exactly the job's environment (every value
  in single quotes) and execs the command as the shell would, with stdin from
  /dev/null: exit 127 not found, 126 not executable, a file without `#!` run by sh.
* **launch.py** (a Python interpreter starting, several times the CPU): where setpriv is
  missing, or the job's env has a name the shell cannot `export` (`my-var`), or its
  program starts with `-`.

Per job, this is most of what starting a job costs on the node.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from services.agent.identity import Account
from services.agent.launch import Launch, encode
from services.agent.shim import LAUNCHER, RunDir

#: A name `export NAME=...` takes (POSIX shells).
_SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin:/usr/sbin:/sbin")


@dataclass(frozen=True, slots=True)
class Start:
    """What the shim runs for a job, and the file its standard input comes from."""

    argv: list[str]
    stdin: str = os.devnull


def quoted(word: str) -> str:
    """`word` in single quotes, for a POSIX shell: any text but NUL, newlines included."""
    return "'" + word.replace("'", "'\\''") + "'"


def start_script(command: Sequence[str], env: Mapping[str, str]) -> str:
    """The shell script that runs `command` with exactly `env` (in the working
    directory the shim entered as root: its parents need not be open to the job)."""
    lines = ["unset PATH PWD OLDPWD"]
    lines += [f"export {name}={quoted(value)}" for name, value in sorted(env.items())]
    lines.append("exec " + " ".join(quoted(word) for word in command) + " </dev/null")
    return "\n".join(lines) + "\n"


def scripted(command: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether a shell script can start `command` with `env` exactly (see the module)."""
    return not command[0].startswith("-") and all(_SHELL_NAME.fullmatch(name) for name in env)


def switch_argv(account: Account, setpriv: str) -> list[str]:
    """setpriv's switch to `account` (its groups, then gid, then uid); nothing when the
    agent already runs as it (an agent that is not root runs jobs as itself)."""
    if (os.geteuid(), os.getegid()) == (account.uid, account.gid):
        return []
    groups = ",".join(str(group) for group in account.groups)
    return [
        setpriv,
        f"--reuid={account.uid}",
        f"--regid={account.gid}",
        f"--groups={groups}" if groups else "--clear-groups",
        "--",
    ]


def process_start(
    run: RunDir,
    command: list[str],
    env: dict[str, str],
    account: Account,
    setpriv: str | None = SETPRIV,
    hide: Sequence[str] = (),
) -> Start:
    """Write the run folder's `launch` file (mode 0600) and say what the shim runs
    (after `hide`, what hides other users' processes: `services.agent.hiding`)."""
    if account.uid == 0:  # `job_accounts` never gives root; this holds if it did
        raise ValueError("refusing to run a job as root")
    fd = os.open(run.file("launch"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    switch = switch_argv(account, setpriv) if setpriv is not None else None
    if switch is not None and scripted(command, env):
        with os.fdopen(fd, "wb") as handle:
            handle.write(os.fsencode(start_script(command, env)))
        give_logs(run, account)
        return Start([*hide, *switch, "/bin/sh", "-s"], str(run.file("launch")))
    launch = Launch(
        [os.fsencode(word) for word in command],
        {os.fsencode(name): os.fsencode(value) for name, value in env.items()},
        account.uid,
        account.gid,
        list(account.groups),
        os.fsencode(run.work),
    )
    with os.fdopen(fd, "wb") as handle:
        handle.write(encode(launch))
    return Start([*hide, sys.executable, "-I", "-S", LAUNCHER, str(run.file("launch"))])


def give_logs(run: RunDir, account: Account) -> None:
    """Create the job's stdout and stderr as its account's (mode 0600), as Slurm's
    output files are the user's: the job may reopen them (`> /dev/stderr`)."""
    if os.geteuid() != 0:
        return
    for name in ("stdout", "stderr"):
        fd = os.open(run.file(name), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.fchown(fd, account.uid, account.gid)
        finally:
            os.close(fd)


def forget_launch(run: RunDir) -> None:
    """Remove the `launch` file once the run ended (it holds the job's environment)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(run.file("launch"))


def unspawned(run: RunDir) -> None:
    """Remove the logs `give_logs` made for a shim that could not be spawned: a run
    folder with logs is one whose shim ran (`RunDir.was_spawned`)."""
    for name in ("stdout", "stderr"):
        with contextlib.suppress(FileNotFoundError):
            if run.file(name).stat().st_size == 0:
                run.file(name).unlink()

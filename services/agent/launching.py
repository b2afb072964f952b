"""What the shim starts for one attempt: `launch.py` for a process, `podman run` for a
job that names an image (`services.agent.containers`), and what can be known to fail
before anything starts."""

from __future__ import annotations

import errno
from collections.abc import Sequence

from services.agent.cgroups import RECORD, JobGroup
from services.agent.containers import (
    Podman,
    container_environment,
    container_launcher,
    env_file_problem,
    visible_devices,
)
from services.agent.identity import Account
from services.agent.jobenv import command_problem, spawn_problem
from services.agent.reconcile import Ensure
from services.agent.shim import SHIM_ENV, Ended, RunDir, spawn_shim
from services.agent.starting import process_start, unspawned


def start_problem(
    action: Ensure, env: dict[str, str], podman: Podman | None, host_path: str | None, run: RunDir
) -> tuple[dict[str, str], Ended | None]:
    """The environment `action`'s command gets (as a container sees it, for an image),
    and how the attempt ends if it can never start (None: it can)."""
    command = action.spec.command
    unfit = spawn_problem(command, env)
    if unfit is not None:
        return env, Ended("failed", None, unfit)
    image = action.spec.image
    if image is None:
        problem = command_problem(command[0], env.get("PATH"), run.work)
        return env, (Ended("failed", problem[0], problem[1]) if problem is not None else None)
    if podman is None:  # placement sends images to nodes with a runtime; it was removed
        return env, Ended(
            "failed", None, f"could not start: this node has no container runtime for {image}"
        )
    inside = container_environment(env, host_path)
    if podman.gpu_devices:
        visible_devices(inside, len(action.gpu_uuids))
    unfit = env_file_problem(inside)
    return inside, (Ended("failed", None, unfit) if unfit is not None else None)


def spawn(
    action: Ensure,
    run: RunDir,
    account: Account,
    env: dict[str, str],
    podman: Podman | None,
    group: JobGroup | None = None,
    hide: Sequence[str] = (),
) -> int:
    """Start the shim of `action` in `run` (see `shim.spawn_shim`), its command in the
    cgroup `group` (made here, removed again if the shim cannot start); its pid.

    An image job's `podman run` stays outside the group: the container runs in
    podman's own cgroups, and podman's client would count against the job's memory.
    """
    if podman is not None and action.spec.image is not None:
        launcher = container_launcher(podman, run, action, account, env)
        return spawn_shim(run, launcher, podman.environ)
    folders = []
    if group is not None:  # first: a group that cannot be made leaves nothing spawned
        group.create()
        run.file(RECORD).write_text(group.record())
        folders = group.folders
    try:
        start = process_start(run, list(action.spec.command), env, account, hide=hide)
        return spawn_shim(run, start.argv, SHIM_ENV, start.stdin, folders)
    except Exception as exc:
        if isinstance(exc, OSError):  # no shim: nothing may say it was spawned
            unspawned(run)
        if group is not None:
            group.remove()
        raise


#: Spawn errors that retrying cannot cure: the job's own argv or env is too big for
#: `execve` (a word over 128 KiB, or the whole over ARG_MAX).
LASTING_SPAWN_ERRORS = frozenset({errno.E2BIG, errno.ENAMETOOLONG})


def never_started(failed: Exception) -> str:
    """Why a spawn that raised `failed` can never start, to report the attempt failed.
    Re-raises what a later try may cure (no memory, too many processes): the agent's
    next round tries again."""
    if isinstance(failed, OSError):
        if failed.errno not in LASTING_SPAWN_ERRORS:
            raise failed
        return f"could not start: {failed.strerror}"
    if isinstance(failed, ValueError | TypeError):  # what spawn_problem did not foresee
        return f"could not start: {failed}"
    raise failed

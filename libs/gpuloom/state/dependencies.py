"""Whether a job's dependencies are met, waiting, or can never be met: the one rule that
admission (which rejects a job whose dependency can never be met), the queue (which
cancels a queued one), placement's queue order, explain and the read model all ask.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from gpuloom.events import Dependency
from gpuloom.state.model import FINAL_PHASES, ClusterState
from gpuloom.state.retention import dependency_unknown, final_phase

DependencyStatus = Literal["met", "waiting", "never"]


def dependency_status(
    state: ClusterState, depends_on: Sequence[Dependency]
) -> tuple[DependencyStatus, str | None]:
    """Whether the jobs of `depends_on` (a job's) have ended as it needs, with a reason if not.

    `never`: a dependency is unknown (never submitted, or ended longer ago than
    `retention.RETENTION`), or ended otherwise than `succeeded` when the job needs it
    to succeed. `waiting`: a dependency has not ended yet. A dependency on an array's id
    is on every task of it.
    """
    waiting: list[str] = []
    for dependency in depends_on:
        if dependency.job in state.arrays:  # an array's id: every task of it (sbatch's habit)
            status, why = _array_status(state, dependency.job, dependency.when)
            if status == "never":
                return status, why
            if status == "waiting":
                waiting.append(why or dependency.job)
            continue
        phase = final_phase(state, dependency.job)  # an ended job may be a tombstone
        if phase is None:
            return "never", dependency_unknown(dependency.job)
        if phase not in FINAL_PHASES:
            waiting.append(
                f"{dependency.job} to {'succeed' if dependency.when == 'succeeded' else 'end'}"
            )
            continue
        if dependency.when == "succeeded" and phase != "succeeded":
            return "never", f"dependency {dependency.job} ended {phase}, not succeeded"
    if waiting:
        return "waiting", "Dependency: waiting for " + ", ".join(waiting)
    return "met", None


def _array_status(
    state: ClusterState, array_id: str, when: str
) -> tuple[DependencyStatus, str | None]:
    """An array as a dependency: met once every task has ended as needed (`afterok`: all
    succeeded), never once one ended otherwise or was forgotten, waiting while any runs."""
    left = 0
    for task_id in state.array_tasks(array_id):
        phase = final_phase(state, task_id)
        if phase is None:
            return "never", dependency_unknown(task_id)
        if phase not in FINAL_PHASES:
            left += 1
        elif when == "succeeded" and phase != "succeeded":
            return "never", f"dependency {array_id}: task {task_id} ended {phase}, not succeeded"
    if left:
        verb = "succeed" if when == "succeeded" else "end"
        return "waiting", f"array {array_id} to {verb} ({left} task(s) left)"
    return "met", None

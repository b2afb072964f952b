"""A job array seen as one job: what `GET /v1/jobs/<array id>` answers (as `squeue -j`),
made of its tasks' rows (`JobReads.lookup`)."""

from __future__ import annotations

from collections import Counter

from gpuloom.state import FINAL_PHASES
from services.gateway.schemas import ArraySummary, ArrayTask, Job

#: While tasks remain, the array takes the state of its most advanced live task.
_LIVE_ORDER = ("running", "placed", "queued", "admitted", "submitted")


def array_state(states: list[str]) -> str:
    """One state for all: the most advanced live task's, or, once all ended,
    `succeeded` when every task did, else the first of failed, timed_out,
    cancelled, rejected that some task ended in."""
    for state in _LIVE_ORDER:
        if state in states:
            return state
    if all(state == "succeeded" for state in states):
        return "succeeded"
    for state in ("failed", "timed_out", "cancelled", "rejected"):
        if state in states:
            return state
    return states[0]


def array_view(array_id: str, tasks: list[Job]) -> Job:
    """The array as one job: the first task's request, the tasks' combined state."""
    first = tasks[0]
    states = [task.state for task in tasks]
    started = [task.started_at for task in tasks if task.started_at is not None]
    finished = [task.finished_at for task in tasks if task.finished_at is not None]
    state = array_state(states)
    return first.model_copy(
        update={
            "id": array_id,
            "state": state,
            "reason": None,
            "node": None,
            "gpus": [],
            "attempt": max(task.attempt for task in tasks),
            "cancel_requested": any(task.cancel_requested for task in tasks),
            "exit_code": None,
            "started_at": min(started) if started else None,
            "finished_at": max(finished) if state in FINAL_PHASES and finished else None,
            "placement": None,
            "array": ArraySummary(
                tasks=[task.id for task in tasks],
                states=dict(sorted(Counter(states).items())),
                members=[
                    ArrayTask(id=t.id, state=t.state, node=t.node, exit_code=t.exit_code)
                    for t in tasks
                ],
            ),
        }
    )

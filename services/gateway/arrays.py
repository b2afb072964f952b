"""A job array seen as one job: what `GET /v1/jobs/<array id>` answers (as `squeue -j`),
and the rows of its tasks."""

from __future__ import annotations

from collections import Counter

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpuloom.state import FINAL_PHASES
from gpuloom.store.models import JobRow
from services.gateway.deps import Gateway
from services.gateway.refusals import Refused, unavailable
from services.gateway.schemas import ArraySummary, Job

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
                tasks=[task.id for task in tasks], states=dict(sorted(Counter(states).items()))
            ),
        }
    )


async def array_rows(
    gateway: Gateway, session: AsyncSession, array_id: str
) -> list[JobRow] | Refused:
    """The rows of an array's tasks, by index; [] if `array_id` is no array; refused
    (503) before the gateway read the log.

    The task ids come from the folded state, not from a range or LIKE on the id
    column: a PostgreSQL collation such as en_US does not sort `-` and `.` bytewise.
    """
    if gateway.read_model is None:
        return unavailable("the gateway has not read the log yet")
    tasks = gateway.read_model.state.array_tasks(array_id)
    if not tasks:
        return []
    rows = {
        row.id: row for row in await session.scalars(select(JobRow).where(JobRow.id.in_(tasks)))
    }
    return [rows[task] for task in tasks if task in rows]

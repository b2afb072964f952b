"""Events written by the gateway: what users ask for."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field, model_validator

from gpuloom.events.base import SUBJECT_TOKEN, JobEvent
from gpuloom.events.jobs import JobSpec
from gpuloom.events.text import HeaderValue


class JobSubmitted(JobEvent):
    """A user submitted a job. The submission is accepted once this event is acked."""

    TYPE: ClassVar[str] = "JobSubmitted"
    #: 2: strings and integers within what storage, the bus and exec hold.
    VERSION: ClassVar[int] = 2
    spec: JobSpec
    idempotency_key: HeaderValue | None = None
    #: For a task of a job array written one event per task (before JobArraySubmitted):
    #: the array's id and this task's index (0-based).
    array_id: str | None = None
    array_index: int | None = Field(default=None, ge=0)


class JobArraySubmitted(JobEvent):
    """A user submitted a job array: `spec.array` tasks, accepted whole or not at all.

    One event, so that a failure part-way can never leave some tasks accepted; the
    fold makes the tasks `<job_id>-<index>` (as Slurm's `<array id>_<index>`), each a
    job of its own with `GPULOOM_ARRAY_INDEX`. `job_id` is the array's id: it shows
    and cancels the whole array.
    """

    TYPE: ClassVar[str] = "JobArraySubmitted"
    spec: JobSpec
    idempotency_key: HeaderValue | None = None

    @model_validator(mode="after")
    def _tasks_are_subject_tokens(self) -> JobArraySubmitted:
        if self.spec.array is None:
            raise ValueError("spec.array (the number of tasks) is required")
        last = array_task_id(self.job_id, self.spec.array - 1)
        if not SUBJECT_TOKEN.match(last):
            raise ValueError(f"task id {last} would be too long for a subject token")
        return self

    def task_ids(self) -> list[str]:
        return [array_task_id(self.job_id, index) for index in range(self.spec.array or 0)]


def array_task_id(array_id: str, index: int) -> str:
    """The job id of task `index` (0-based) of array `array_id`."""
    return f"{array_id}-{index}"


class JobCancelRequested(JobEvent):
    """A user asked to cancel a job (or, with an array's id, every task of the array
    that has not ended); the queue or the node agent carries it out."""

    TYPE: ClassVar[str] = "JobCancelRequested"
    requested_by: str | None = None

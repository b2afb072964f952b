"""Events written by the gateway: what users ask for."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gpuloom.events.base import JobEvent
from gpuloom.events.jobs import JobSpec


class JobSubmitted(JobEvent):
    """A user submitted a job. The submission is accepted once this event is acked."""

    TYPE: ClassVar[str] = "JobSubmitted"
    spec: JobSpec
    idempotency_key: str | None = None
    #: For a task of a job array: the array's id and this task's index (0-based).
    array_id: str | None = None
    array_index: int | None = Field(default=None, ge=0)


class JobCancelRequested(JobEvent):
    """A user asked to cancel a job; the queue or the node agent carries it out."""

    TYPE: ClassVar[str] = "JobCancelRequested"
    requested_by: str | None = None

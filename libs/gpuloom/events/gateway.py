"""Events written by the gateway: what users ask for."""

from __future__ import annotations

from typing import ClassVar

from gpuloom.events.base import JobEvent
from gpuloom.events.jobs import JobSpec


class JobSubmitted(JobEvent):
    """A user submitted a job. The submission is accepted once this event is acked."""

    TYPE: ClassVar[str] = "JobSubmitted"
    spec: JobSpec
    idempotency_key: str | None = None


class JobCancelRequested(JobEvent):
    """A user asked to cancel a job; the queue or the node agent carries it out."""

    TYPE: ClassVar[str] = "JobCancelRequested"
    requested_by: str | None = None

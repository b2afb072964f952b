"""Events written by the admission service."""

from __future__ import annotations

from typing import ClassVar

from gpuloom.events.base import JobEvent


class JobAdmitted(JobEvent):
    """Some registered node could run the job."""

    TYPE: ClassVar[str] = "JobAdmitted"


class JobRejected(JobEvent):
    """No registered node could ever run the job; `reason` says why."""

    TYPE: ClassVar[str] = "JobRejected"
    reason: str

"""Events written by the admission service."""

from __future__ import annotations

from typing import ClassVar

from gpuloom.events.base import JobEvent


class JobAdmitted(JobEvent):
    """Some registered node could run the job (or, with an array's id, every task of
    the array still waiting for admission)."""

    TYPE: ClassVar[str] = "JobAdmitted"


class JobRejected(JobEvent):
    """No registered node could ever run the job (or, with an array's id, any task of
    the array still waiting for admission); `reason` says why."""

    TYPE: ClassVar[str] = "JobRejected"
    reason: str

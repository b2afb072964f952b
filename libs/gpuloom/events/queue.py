"""Events written by the queue service."""

from __future__ import annotations

from typing import ClassVar

from gpuloom.events.base import JobEvent


class JobQueued(JobEvent):
    """The job waits for placement with this effective priority (higher first)."""

    TYPE: ClassVar[str] = "JobQueued"
    priority: int


class JobCancelled(JobEvent):
    """A cancel request was carried out before the job started on a node.

    Jobs that already run are cancelled by their node agent, which reports
    `JobFinished` with outcome `cancelled` once the process is gone.
    """

    TYPE: ClassVar[str] = "JobCancelled"
    reason: str = "cancelled by user"

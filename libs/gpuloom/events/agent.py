"""Events written by node agents."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AwareDatetime, Field

from gpuloom.events.base import JobEvent

#: `preempted`: stopped for a JobPreempted; the job is requeued, not ended.
Outcome = Literal["succeeded", "failed", "timed_out", "cancelled", "preempted"]


class JobStarted(JobEvent):
    """The job's process runs on `node` for placement attempt `attempt`."""

    TYPE: ClassVar[str] = "JobStarted"
    attempt: int = Field(ge=1)
    node: str
    replica: int = Field(default=0, ge=0)
    pid: int | None = None


class JobFinished(JobEvent):
    """The job's process ended (or never started, when cancelled while placed)."""

    TYPE: ClassVar[str] = "JobFinished"
    attempt: int = Field(ge=1)
    node: str
    replica: int = Field(default=0, ge=0)
    outcome: Outcome
    exit_code: int | None = None
    reason: str | None = None
    #: When the process ended, by the node's clock (its shim's record), if known. The
    #: report may come much later (the agent was down); the run is charged up to here,
    #: kept by the fold within [the run's start, this event's `at`].
    ended_at: AwareDatetime | None = None

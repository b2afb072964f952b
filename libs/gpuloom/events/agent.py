"""Events written by node agents."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AwareDatetime, Field, model_validator

from gpuloom.events.base import JobEvent
from gpuloom.events.text import HOST_ADDRESS

#: `preempted`: stopped for a JobPreempted; the job is requeued, not ended.
Outcome = Literal["succeeded", "failed", "timed_out", "cancelled", "preempted"]


class JobStarted(JobEvent):
    """The job's process runs on `node` for placement attempt `attempt`."""

    TYPE: ClassVar[str] = "JobStarted"
    attempt: int = Field(ge=1)
    node: str
    replica: int = Field(default=0, ge=0)
    pid: int | None = None
    #: Replica 0 of a gang: where the other replicas reach it (their `MASTER_ADDR` and
    #: `MASTER_PORT`): its node's address and a port its agent reserved. The other
    #: replicas start once this is in the log.
    master_addr: str | None = Field(default=None, pattern=HOST_ADDRESS)
    master_port: int | None = Field(default=None, ge=1, le=65535)

    @model_validator(mode="after")
    def _master_of_replica_zero(self) -> JobStarted:
        if (self.master_addr is None) != (self.master_port is None):
            raise ValueError("master_addr and master_port go together")
        if self.master_port is not None and self.replica != 0:
            raise ValueError("only replica 0 is a gang's master")
        return self


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

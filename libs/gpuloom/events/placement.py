"""Events written by the placement service."""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field

from gpuloom.events.base import JobEvent


class PolicyRef(BaseModel):
    """Which policy made a decision, at which version, with which parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: int
    params: dict[str, Any] = Field(default_factory=dict)


class JobPlaced(JobEvent):
    """Placement assigned GPUs of one node to one attempt of a job.

    `basis_seq` is the stream sequence the placement state was folded to when the
    decision was made and `cycle_position` the job's rank among the decisions of
    that cycle: folding the log to `basis_seq` and re-running `policy` must give
    the same assignment.
    """

    TYPE: ClassVar[str] = "JobPlaced"
    attempt: int = Field(ge=1)
    node: str
    gpu_indexes: list[int]
    gpu_uuids: list[str]
    basis_seq: int = Field(ge=0)
    cycle_position: int = Field(ge=0)
    policy: PolicyRef

"""Events written by the accounting service."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gpuloom.events.base import JobEvent


class UsageCharged(JobEvent):
    """GPU time of one run (attempt) of a job, charged to its user and account.

    `gpu_milli_seconds` is the exact integer charge (1000 per GPU per second, so a
    0.25 slice for an hour is 0.25 GPU-hours); `seconds` the wall time of the run,
    from the log's own timestamps; `by_model` the charge split by GPU model.
    """

    TYPE: ClassVar[str] = "UsageCharged"
    attempt: int = Field(ge=1)
    user: str
    account: str
    gpus: int = Field(ge=0)
    seconds: float = Field(ge=0)
    gpu_milli_seconds: int = Field(ge=0)
    by_model: dict[str, int] = Field(default_factory=dict)

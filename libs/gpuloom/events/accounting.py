"""Events written by the accounting service."""

from __future__ import annotations

from datetime import datetime
from typing import ClassVar

from pydantic import Field

from gpuloom.events.base import JobEvent


class UsageCharged(JobEvent):
    """GPU time of one run (attempt) of a job, charged to its user and account.

    `gpu_milli_seconds` is the exact integer charge (1000 per GPU per second, so a
    0.25 slice for an hour is 0.25 GPU-hours); `seconds` the wall time charged,
    from the log's own timestamps; `by_model` the charge split by GPU model.

    A running job is charged periodically: an interim charge (`period_end` set)
    covers the run from the previous charge (or its start) to `period_end`; the
    final charge (`period_end` None) covers the rest once the run has ended, so the
    charges of a run add up exactly to its GPU time. `part` numbers the charges of
    one attempt from 0: it makes every charge a unique ledger row.
    """

    TYPE: ClassVar[str] = "UsageCharged"
    attempt: int = Field(ge=1)
    user: str
    account: str
    gpus: int = Field(ge=0)
    seconds: float = Field(ge=0)
    gpu_milli_seconds: int = Field(ge=0)
    by_model: dict[str, int] = Field(default_factory=dict)
    part: int = Field(default=0, ge=0)
    period_end: datetime | None = None

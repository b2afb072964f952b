"""Events written by `gpuloom audit`: the result of re-running recorded decisions."""

from __future__ import annotations

from typing import ClassVar

from pydantic import Field

from gpuloom.events.base import SUBJECT_TOKEN, Event


class AuditCompleted(Event):
    """An audit re-ran every placement decision of seqs `from_seq`..`to_seq`.

    `verified` decisions were reproduced exactly; `mismatches` (the first 50 of
    `mismatch_count`) describe the others. Kept in the log like everything else,
    so `GET /v1/audit` is a fold like every other read.
    """

    TYPE: ClassVar[str] = "AuditCompleted"
    AGGREGATE: ClassVar[str] = "audit"
    audit_id: str = Field(pattern=SUBJECT_TOKEN.pattern)
    from_seq: int = Field(ge=0)
    to_seq: int = Field(ge=0)
    verified: int = Field(ge=0)
    mismatch_count: int = Field(ge=0)
    mismatches: list[str] = Field(default_factory=list, max_length=50)
    seconds: float = Field(ge=0)

    def aggregate_id(self) -> str:
        return self.audit_id

"""Base class of every event payload and the envelope that carries it on the bus.

Events are facts in the past tense, frozen, declared once here and used by every
process. The envelope is the wire shape of one log entry (design §5):
`id, type, v, at, by, correlation_id, causation_id, data`, and `principal` on what
a request caused.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

#: Names that become NATS subject tokens (node names, job ids) must not contain
#: `.`, `*`, `>` or whitespace.
SUBJECT_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,62}$")


class Event(BaseModel):
    """One fact. Subclasses set TYPE, VERSION and AGGREGATE and name their aggregate id."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    TYPE: ClassVar[str]
    VERSION: ClassVar[int] = 1
    #: "job" or "node": the aggregate the event belongs to, first token of its subject.
    AGGREGATE: ClassVar[str]

    def aggregate_id(self) -> str:
        """The id of the aggregate this event is about (job id or node name)."""
        raise NotImplementedError  # every concrete event overrides this


class JobEvent(Event):
    """An event about one job."""

    AGGREGATE: ClassVar[str] = "job"
    job_id: str = Field(pattern=SUBJECT_TOKEN.pattern)

    def aggregate_id(self) -> str:
        return self.job_id


class NodeEvent(Event):
    """An event about one node."""

    AGGREGATE: ClassVar[str] = "node"
    node: str = Field(pattern=SUBJECT_TOKEN.pattern)

    def aggregate_id(self) -> str:
        return self.node


class Envelope(BaseModel):
    """The stored form of one event. `data` is the payload as written at version `v`."""

    model_config = ConfigDict(frozen=True)

    id: str = Field(min_length=1, max_length=200)
    type: str = Field(min_length=1, max_length=100)
    v: int
    #: When it happened, with its time zone: the fold compares times from every writer.
    at: AwareDatetime
    by: str = Field(min_length=1, max_length=100)
    correlation_id: str | None = Field(default=None, max_length=200)
    causation_id: str | None = Field(default=None, max_length=200)
    data: dict[str, Any]
    #: Who asked, for an event a request caused: the authenticated user the gateway
    #: saw (an operator acting for another user is named here, the user in `data`).
    #: Absent (not null) on the wire when unknown; readers ignore it when absent.
    principal: str | None = Field(default=None, max_length=100, exclude_if=lambda v: v is None)

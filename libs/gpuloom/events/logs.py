"""The request for a job's logs, from the gateway to the agent that ran it: part of the
wire contract, so that both sides check the same bounds without importing each other.

Sent as JSON in a core NATS request on `agent_logs_subject(node)`; the agent's answer
is described in `services/agent/logs.py`.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from gpuloom.events.base import SUBJECT_TOKEN

DEFAULT_TAIL = 65536
MAX_TAIL = 4 * 1024 * 1024


class LogsRequest(BaseModel):
    """The tail of one replica's stdout and stderr, of one attempt (None: its latest)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job_id: str = Field(pattern=SUBJECT_TOKEN.pattern)  # also keeps paths inside the root
    tail_bytes: int = Field(default=DEFAULT_TAIL, ge=0, le=MAX_TAIL)
    replica: int = Field(default=0, ge=0, le=1023)
    attempt: int | None = Field(default=None, ge=1)

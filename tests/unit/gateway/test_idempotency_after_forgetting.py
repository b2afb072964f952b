"""The gateway's idempotent retry reads the fold's keys: a job that ended and left the
live state still answers for its key (its tombstone), and still only to its user."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from gpuloom.auth import Principal
from gpuloom.config import Settings
from gpuloom.testing.builders import LogBuilder
from services.gateway.jobs.submitting import submitted_with
from services.gateway.parts import Gateway
from services.gateway.reads import Reads
from services.gateway.refusals import Refused
from services.gateway.schemas import Submitted


def reads_after(log: LogBuilder) -> Reads:
    """The reads of a gateway whose fold is `log` (no write of its own to wait for)."""
    read_model: Any = SimpleNamespace(state=log.state())
    return Reads(Gateway(Settings(), sessions=None, read_model=read_model))  # type: ignore[arg-type]


def finished_with_key() -> LogBuilder:
    log = LogBuilder()
    log.submit("j1", gpus=64, idempotency_key="once", user="alice")
    log.reject("j1", "too big")  # final, nothing to charge: forgotten at once
    return log


async def test_a_retry_of_a_forgotten_job_answers_with_the_job_and_its_end() -> None:
    log = finished_with_key()
    assert "j1" in log.state().tombstones
    answer = await submitted_with(reads_after(log), "once", Principal("alice"), "alice")
    assert isinstance(answer, Submitted) and (answer.id, answer.state) == ("j1", "rejected")


async def test_another_users_key_is_refused_after_the_job_was_forgotten() -> None:
    reads = reads_after(finished_with_key())
    refused = await submitted_with(reads, "once", Principal("mallory"), "mallory")
    assert isinstance(refused, Refused) and refused.status == 409

"""The gateway's commands return their refusals as values (`refusals.Refused`,
`Invalid`), tested here without an application; `answer` is the one place they
become HTTP errors, with the status, detail and headers the command gave."""

from __future__ import annotations

import ast
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import pytest
from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError

from gpuloom.auth import OPERATOR, Principal
from gpuloom.config import Settings
from gpuloom.events import ReservationCreated, ReservationSpec, ReservedGpu, SharesSet
from gpuloom.store.models import JobRow
from gpuloom.testing.builders import LogBuilder
from services.gateway.accounts.routes import _change
from services.gateway.jobs.batch import JobBatch, submit_jobs
from services.gateway.jobs.cancelling import cancel
from services.gateway.jobs.requests import JobRequest
from services.gateway.jobs.submitting import checked_spec, submit
from services.gateway.parts import Gateway
from services.gateway.publish import Publisher
from services.gateway.readmodel import ReadModel
from services.gateway.reads import Reads
from services.gateway.refusals import Invalid, Refused, answer

ALICE = Principal("alice")
BOB = Principal("bob")
ROOT = Principal("root", frozenset({OPERATOR}))
GATEWAY = Path(__file__).parents[3] / "services" / "gateway"


def gateway_after(log: LogBuilder) -> Gateway:
    """A gateway whose fold is `log` and that has no bus (its writes are refused)."""
    read_model = ReadModel(bus=None, sessions=None)  # type: ignore[arg-type]
    read_model.follower.state = log.state()
    read_model.written_seq = log.state().seq
    settings = Settings(read_your_writes_timeout_s=0.05)
    return Gateway(settings=settings, sessions=None, read_model=read_model)  # type: ignore[arg-type]


def job(**fields: Any) -> JobRequest:
    return JobRequest.model_validate(
        {"name": "train", "account": "research", "command": ["true"], "gpus": 0, **fields}
    )


def test_a_refusal_becomes_its_http_error_and_a_value_passes() -> None:
    with pytest.raises(HTTPException) as refused:
        answer(Refused(503, "the log is away", (("Retry-After", "2"),)))
    assert (refused.value.status_code, refused.value.detail) == (503, "the log is away")
    assert refused.value.headers == {"Retry-After": "2"}
    with pytest.raises(HTTPException) as plain:
        answer(Refused(403, "no"))
    assert plain.value.headers is None
    with pytest.raises(RequestValidationError) as invalid:
        answer(Invalid.at(("body", "gpus"), "too many"))
    assert invalid.value.errors() == [
        {"loc": ("body", "gpus"), "msg": "too many", "type": "value_error"}
    ]
    assert answer(7) == 7 and answer(None) is None


def checked(request: JobRequest, gateway: Gateway, principal: Principal) -> Any:
    return checked_spec(request, principal, Reads(gateway), gateway.settings)


def commands(gateway: Gateway) -> tuple[Publisher, Reads, Settings]:
    """What a submission command takes of `gateway`: its writes, its reads, its settings."""
    return Publisher(gateway), Reads(gateway), gateway.settings


def test_submitting_for_another_user_is_refused_unless_an_operator() -> None:
    gateway = gateway_after(LogBuilder())
    refused = checked(job(user="bob"), gateway, ALICE)
    assert isinstance(refused, Refused) and refused.status == 403
    assert not isinstance(checked(job(user="bob"), gateway, ROOT), Refused | Invalid)


def test_an_unknown_priority_class_and_a_reserved_variable_are_refused() -> None:
    gateway = gateway_after(LogBuilder())
    unknown = checked(job(priority_class="gold"), gateway, ALICE)
    assert isinstance(unknown, Refused) and unknown.status == 403
    assert unknown.detail.startswith("priority class gold does not exist (classes: ")
    reserved = checked(job(env={"CUDA_VISIBLE_DEVICES": "0", "A": "1"}), gateway, ALICE)
    assert isinstance(reserved, Invalid)
    assert [e["loc"] for e in reserved.errors] == [("body", "env", "CUDA_VISIBLE_DEVICES")]


def test_a_job_no_node_could_run_names_the_field_at_fault() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    infeasible = checked(job(gpus=8), gateway_after(log), ALICE)
    assert isinstance(infeasible, Invalid)
    assert infeasible.errors[0]["loc"] == ("body", "gpus")
    assert infeasible.errors[0]["msg"].startswith("no node could ever run this job: ")


def test_a_job_naming_a_reservation_that_does_not_let_it_in_names_the_field() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    start = log.now + timedelta(hours=1)
    spec = ReservationSpec(
        start=start,
        end=start + timedelta(hours=1),
        gpus=[ReservedGpu(node="n1", index=0)],
        accounts=["research"],
    )
    log.append(ReservationCreated(name="window", spec=spec))
    gateway = gateway_after(log)
    for request, why in (
        (job(account="other", reservation="window"), "does not let user alice or account other"),
        (job(reservation="nowhere"), "reservation nowhere does not exist"),
        (job(gpus=2, reservation="window"), "the job asks 2 GPUs; reservation window holds 1"),
    ):
        refused = checked(request, gateway, ALICE)
        assert isinstance(refused, Invalid), request
        [error] = refused.errors
        assert error["loc"] == ("body", "reservation") and why in error["msg"], error
    let_in = checked(job(gpus=1, reservation="window"), gateway, ALICE)
    assert not isinstance(let_in, Refused | Invalid) and let_in.reservation == "window"


async def test_a_submission_the_log_cannot_take_is_refused_503_with_retry_after() -> None:
    gateway = gateway_after(LogBuilder())
    refused = await submit(*commands(gateway), job(), ALICE, None)
    assert isinstance(refused, Refused)
    assert (refused.status, refused.headers) == (503, (("Retry-After", "2"),))


async def test_another_users_idempotency_key_is_refused_409() -> None:
    log = LogBuilder()
    log.submit("j1", gpus=0, idempotency_key="once", user="alice")
    gateway = gateway_after(log)
    refused = await submit(*commands(gateway), job(), BOB, "once")
    assert refused == Refused(409, "this Idempotency-Key was used by another user's job")


async def test_a_batch_names_the_job_whose_fields_are_at_fault() -> None:
    batch = JobBatch(jobs=[job(), job(env={"GPULOOM_X": "1"})])
    gateway = gateway_after(LogBuilder())
    refused = await submit_jobs(*commands(gateway), batch, ALICE, None)
    assert isinstance(refused, Invalid)
    assert [e["loc"] for e in refused.errors] == [("body", "jobs", 1, "env", "GPULOOM_X")]


class Rows:
    """Sessions with the one method `JobReads` reads a job row with."""

    def __init__(self, *rows: JobRow) -> None:
        self.rows = {row.id: row for row in rows}

    def __call__(self) -> Rows:
        return self

    async def __aenter__(self) -> Rows:
        return self

    async def __aexit__(self, *exc: object) -> None:
        return None

    async def get(self, model: type, key: str) -> JobRow | None:
        return self.rows.get(key)


def row(job_id: str, user: str, state: str) -> JobRow:
    now = datetime(2026, 1, 1, tzinfo=UTC)
    return JobRow(id=job_id, name="n", user=user, account="research", state=state, submitted_at=now)


@pytest.mark.parametrize(
    ("principal", "job_id", "expected"),
    [
        (ALICE, "gone", Refused(404, "job gone not found")),
        (BOB, "mine", Refused(403, "bob may not cancel a job of alice: only its user, a coordinator of account research or an operator may")),
        (ALICE, "done", Refused(409, "job done already succeeded")),
        (ALICE, "mine", Refused(503, "the event log (NATS) is unreachable; retry shortly", (("Retry-After", "2"),))),
    ],
    ids=["no such job", "another user's job", "a job that ended", "the log is away"],
)  # fmt: skip
async def test_a_cancellation_is_refused_with_why(
    principal: Principal, job_id: str, expected: Refused
) -> None:
    gateway = gateway_after(LogBuilder())
    gateway.sessions = Rows(row("mine", "alice", "queued"), row("done", "alice", "succeeded"))  # type: ignore[assignment]
    refused = await cancel(Publisher(gateway), Reads(gateway), job_id, principal)
    assert refused == expected


def dropped_writes(source: str) -> list[int]:
    """The lines of each `await publisher.publish(...)` (or `publish_batch`) whose result
    is thrown away."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Await)
        and isinstance(node.value.value, ast.Call)
        and (
            getattr(node.value.value.func, "attr", None)
            or getattr(node.value.value.func, "id", None)
        )
        in ("publish", "publish_batch")
    ]


def test_no_write_to_the_log_drops_its_refusal() -> None:
    """`Publisher.publish` returns its refusal: a call whose result is thrown away would
    answer success for a write the log never took."""
    assert dropped_writes("async def f():\n    await publisher.publish(event, principal=p)") == [2]
    assert dropped_writes("async def f():\n    answer(await publisher.publish(event))") == []
    dropped = [
        f"{path.name}:{line}"
        for path in sorted(GATEWAY.rglob("*.py"))
        for line in dropped_writes(path.read_text())
    ]
    assert not dropped


async def test_an_account_change_of_an_unknown_account_is_refused_404() -> None:
    shares = partial(SharesSet, account="ghost", shares=2)
    gateway = gateway_after(LogBuilder())
    refused = await _change(Publisher(gateway), Reads(gateway), "ghost", ROOT, "shares", shares)
    assert refused == Refused(404, "account ghost not found")

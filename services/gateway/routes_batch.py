"""POST /v1/job-batches: many jobs in one request, written to the log in one pipelined
write.

Each job is checked as `POST /v1/jobs` checks it: who may submit it, its class and
priority, its time limit and env, whether some node could ever run it. An error
names the job (`body.jobs.3.gpus`, or `jobs[3]: ...` in a 403), and then nothing is
written. The events are the ones single submissions would write, one per job (or per
job array), in the batch's order; they go to the log pipelined, so the request waits
for one round of acks instead of one per job.

The write is not atomic: if the log fails part-way (503), the first jobs may have been
accepted. With an `Idempotency-Key` each job gets the key `<key>/<index>`, so a retry
of the same batch accepts only what is missing and answers with every job's id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Header
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, Field

from gpuloom.events.text import HeaderValue
from services.gateway.auth import PrincipalDep
from services.gateway.deps import GatewayDep
from services.gateway.publish import publish_batch
from services.gateway.requests import JobRequest
from services.gateway.responses import SUBMIT_RESPONSES
from services.gateway.schemas import Submitted
from services.gateway.submit_policy import check_batch_limits
from services.gateway.submitting import accepted, checked_spec, submission_event, submitted_with

router = APIRouter(prefix="/v1/job-batches", tags=["jobs"])

#: The most jobs one batch may carry (a job array of any size counts as one).
MAX_BATCH = 1000
T = TypeVar("T")


class JobBatch(BaseModel):
    """Jobs to submit together, each as the body of `POST /v1/jobs`."""

    jobs: list[JobRequest] = Field(min_length=1, max_length=MAX_BATCH)


class BatchSubmitted(BaseModel):
    #: One answer per job of the batch, in its order.
    jobs: list[Submitted]


def _at(number: int, check: Callable[[], T]) -> T:
    """`check()`, with a 422's locations moved under `body.jobs.<number>`."""
    try:
        return check()
    except RequestValidationError as exc:
        errors: list[dict[str, Any]] = [
            {**error, "loc": ("body", "jobs", number, *tuple(error["loc"])[1:])}
            for error in exc.errors()
        ]
        raise RequestValidationError(errors) from exc


@router.post(
    "",
    status_code=202,
    response_model=BatchSubmitted,
    responses=SUBMIT_RESPONSES,
)
async def submit_batch(
    batch: JobBatch,
    gateway: GatewayDep,
    principal: PrincipalDep,
    idempotency_key: Annotated[HeaderValue | None, Header()] = None,
) -> BatchSubmitted:
    """Accept every job of the batch once the log acknowledged them (see the module's
    docstring: checked as one by one, written in one pipelined write)."""
    specs = [
        _at(number, lambda job=job: checked_spec(job, gateway, principal))  # type: ignore[misc]
        for number, job in enumerate(batch.jobs)
    ]
    keys: list[str | None] = [None] * len(specs)
    answers: list[Submitted | None] = [None] * len(specs)
    if idempotency_key is not None:
        keys = [f"{idempotency_key}/{number}" for number in range(len(specs))]
        if len(keys[-1] or "") > 200:
            raise RequestValidationError(
                [
                    {
                        "loc": ("header", "idempotency-key"),
                        "msg": "too long for a batch: with /<index> it must stay within 200",
                        "type": "string_too_long",
                    }
                ]
            )
        for number, key in enumerate(keys):
            user = specs[number].user
            answers[number] = await submitted_with(gateway, key or "", principal, user)
    missing = [number for number, answer in enumerate(answers) if answer is None]
    await check_batch_limits(gateway, [specs[number] for number in missing])
    events = [
        (
            submission_event(specs[number], keys[number]),
            f"submit:{keys[number]}" if keys[number] else None,
        )
        for number in missing
    ]
    if events:
        recorded = await publish_batch(gateway, events, principal=principal)
        for number, written in zip(missing, recorded, strict=True):
            answers[number] = accepted(written.event, "submitted")
    return BatchSubmitted(jobs=[answer for answer in answers if answer is not None])

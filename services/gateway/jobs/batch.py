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

from typing import Annotated

from fastapi import APIRouter, Header
from pydantic import BaseModel, Field

from gpuloom.auth import Principal
from gpuloom.config import Settings
from gpuloom.events import JobSpec
from gpuloom.events.text import HeaderValue
from services.gateway.auth import PrincipalDep
from services.gateway.bodies import Body
from services.gateway.deps import PublisherDep, ReadsDep, SettingsDep
from services.gateway.jobs.requests import JobRequest
from services.gateway.jobs.submit_policy import over_batch_limits
from services.gateway.jobs.submitting import (
    accepted,
    checked_spec,
    submission_event,
    submitted_with,
)
from services.gateway.publish import Publisher
from services.gateway.reads import Reads
from services.gateway.refusals import Invalid, Refusal, Refused, answer
from services.gateway.responses import SUBMIT_RESPONSES
from services.gateway.schemas import Submitted

router = APIRouter(prefix="/v1/job-batches", tags=["jobs"])

#: The most jobs one batch may carry (a job array of any size counts as one).
MAX_BATCH = 1000


class JobBatch(Body):
    """Jobs to submit together, each as the body of `POST /v1/jobs`."""

    jobs: list[JobRequest] = Field(min_length=1, max_length=MAX_BATCH)


class BatchSubmitted(BaseModel):
    #: One answer per job of the batch, in its order.
    jobs: list[Submitted]


@router.post(
    "",
    status_code=202,
    response_model=BatchSubmitted,
    responses=SUBMIT_RESPONSES,
)
async def submit_batch(
    batch: JobBatch,
    publisher: PublisherDep,
    reads: ReadsDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    idempotency_key: Annotated[HeaderValue | None, Header()] = None,
) -> BatchSubmitted:
    """Accept every job of the batch once the log acknowledged them (see the module's
    docstring: checked as one by one, written in one pipelined write)."""
    return answer(await submit_jobs(publisher, reads, settings, batch, principal, idempotency_key))


async def submit_jobs(
    publisher: Publisher,
    reads: Reads,
    settings: Settings,
    batch: JobBatch,
    principal: Principal,
    key: str | None,
) -> BatchSubmitted | Refusal:
    """The batch's command: every job accepted (or found, for a retry), or the refusal
    of the first job refused (a 422's fields under `body.jobs.<number>`)."""
    specs: list[JobSpec] = []
    for number, job in enumerate(batch.jobs):
        spec = checked_spec(job, principal, reads, settings)
        if isinstance(spec, Invalid):
            return spec.under("jobs", number)
        if isinstance(spec, Refused):
            return spec
        specs.append(spec)
    keys: list[str | None] = [None] * len(specs)
    answers: list[Submitted | None] = [None] * len(specs)
    if key is not None:
        keys = [f"{key}/{number}" for number in range(len(specs))]
        if len(keys[-1] or "") > 200:
            too_long = "too long for a batch: with /<index> it must stay within 200"
            return Invalid.at(("header", "idempotency-key"), too_long, "string_too_long")
        for number, job_key in enumerate(keys):
            found = await submitted_with(reads, job_key or "", principal, specs[number].user)
            if isinstance(found, Refused):
                return found
            answers[number] = found
    missing = [number for number, done in enumerate(answers) if done is None]
    over = await over_batch_limits(reads, [specs[number] for number in missing])
    if over is not None:
        return over
    events = [
        (
            submission_event(specs[number], keys[number]),
            f"submit:{keys[number]}" if keys[number] else None,
        )
        for number in missing
    ]
    if events:
        recorded = await publisher.publish_batch(events, principal=principal)
        if isinstance(recorded, Refused):
            return recorded
        for number, written in zip(missing, recorded, strict=True):
            answers[number] = accepted(written.event, "submitted")
    return BatchSubmitted(jobs=[done for done in answers if done is not None])

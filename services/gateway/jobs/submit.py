"""POST /v1/jobs: accept a job, or a job array, as the authenticated user.

The job's user is the token's: a body `user` is optional, and one that names
someone else is refused (403) unless the caller is an operator, who may submit for
another user; the log then records both (the user in the spec, the operator as the
envelope's `principal`). So fair share and quotas charge the token's user.

The job's priority class and priority, and its user's and account's limits, are
checked by `submit_policy` before the event is written (docs/security.md); what a
submission checks and writes is `submitting`'s, shared with POST /v1/job-batches: the
command (`submitting.submit`) returns its refusal, which this route answers.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header

from gpuloom.events.text import HeaderValue
from services.gateway.auth import PrincipalDep
from services.gateway.deps import PublisherDep, ReadsDep, SettingsDep
from services.gateway.jobs.requests import JobRequest
from services.gateway.jobs.submitting import submit
from services.gateway.refusals import answer
from services.gateway.responses import SUBMIT_RESPONSES
from services.gateway.schemas import Submitted

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])


@router.post(
    "",
    status_code=202,
    response_model=Submitted,
    responses=SUBMIT_RESPONSES,
)
async def submit_job(
    request: JobRequest,
    publisher: PublisherDep,
    reads: ReadsDep,
    settings: SettingsDep,
    principal: PrincipalDep,
    idempotency_key: Annotated[HeaderValue | None, Header()] = None,
) -> Submitted:
    """Accept a job (or a whole job array) once its event is acknowledged by the log.

    A retry with the same `Idempotency-Key` returns the job the first request
    created, never a second one. An array is one JobArraySubmitted event: it is
    accepted whole or not at all, and its id shows and cancels every task.
    """
    return answer(await submit(publisher, reads, settings, request, principal, idempotency_key))

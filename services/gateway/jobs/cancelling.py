"""Cancelling a job: the command of `DELETE /v1/jobs/{id}`, which returns its
refusal (`refusals.Refused`) for the route to answer.

A job, or a job array's id (every task that has not ended, one event, as
`scancel <array id>`), that the caller may cancel (`gpuloom.auth.policy.job_problem`)
and that has not ended gets a JobCancelRequested; the queue (a pending job) or the
node agent (a running one) does the rest.
"""

from __future__ import annotations

from gpuloom.auth import Principal
from gpuloom.events import JobCancelRequested, intents
from gpuloom.state import FINAL_PHASES
from services.gateway.auth import job_refusal
from services.gateway.publish import Publisher
from services.gateway.reads import Reads
from services.gateway.refusals import Refused
from services.gateway.schemas import CancelAccepted


async def cancel(
    publisher: Publisher, reads: Reads, job_id: str, principal: Principal
) -> CancelAccepted | Refused:
    """Ask for the cancellation of `job_id` once the caller's own writes are read:
    refused 404 (no such job), 403 (not the caller's to cancel), 409 (it ended), or
    as the log refuses the write (503, 413)."""
    await reads.catch_up(principal.name)
    standing = await reads.jobs.standing(job_id)
    if isinstance(standing, Refused):
        return standing
    user, account, state = standing.user, standing.account, standing.state
    refused = job_refusal(reads.accounts(), principal, "cancel", user, account)
    if refused is not None:
        return refused
    if state in FINAL_PHASES:
        return Refused(409, f"job {job_id} already {state}")
    recorded = await publisher.publish(
        JobCancelRequested(job_id=job_id, requested_by=principal.name),
        intents.cancel_requested(job_id),
        principal=principal,
    )
    if isinstance(recorded, Refused):
        return recorded
    return CancelAccepted(id=job_id, state=state, cancel_requested=True)

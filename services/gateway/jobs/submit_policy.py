"""A submission's priority class, priority and limits, checked before it is published.

The rules are pure (`gpuloom.queueing.classes`, `.limits`, `gpuloom.auth.policy`); this module
reads the gateway's folded state (`Reads.submissions`) and refuses (`refusals.Refused`): an unknown class, a class
the job's user and account may not use, a priority over the class's (but for an
operator), or a submission over `max_submit_jobs` or `max_array_size` is 403 with
the reason. An unknown class is 403, not 422, as in Kubernetes ("no PriorityClass
with name ... was found"): the request is well formed, and which classes exist is
the cluster's state, not the contract's. Admission checks the same on the log, in
submission order, and is what holds when two submissions race past a stale check.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from gpuloom.auth import Principal
from gpuloom.auth.policy import priority_problem
from gpuloom.events import JobSpec
from gpuloom.queueing.classes import class_use_problem
from gpuloom.queueing.limits import identities
from gpuloom.state.tenancy import CLUSTER_TOTAL
from services.gateway.jobs.requests import JobRequest
from services.gateway.reads import Reads
from services.gateway.refusals import Refused, denied

log = logging.getLogger(__name__)

#: The limits an operator may set for everyone (they apply to every submission).
OPERATOR_DEFAULTS = (("default", "user"), ("default", "account"), CLUSTER_TOTAL)


def submission_class(
    request: JobRequest, user: str, principal: Principal, reads: Reads
) -> tuple[int, str] | Refused:
    """The priority and the priority class to publish: the request's class (or the
    default one) and its priority (the class's when the request gives none), once the
    caller may have them; else refused (403). Before the gateway read the log: the
    built-in class only."""
    known = reads.submissions.priority_class(request.priority_class)
    if known is None:
        names = ", ".join(reads.submissions.class_names())
        reason = f"priority class {request.priority_class} does not exist (classes: {names})"
        return Refused(403, reason)
    refused = denied(class_use_problem(known, user, request.account))
    if refused is not None:
        return refused
    priority = known.priority if request.priority is None else request.priority
    refused = denied(priority_problem(principal, priority, known.name, known.priority))
    if refused is not None:
        return refused
    if priority > known.priority:
        log.info(
            "operator %s set priority %d for a job of %s, over priority class %s's %d",
            principal.name,
            priority,
            user,
            known.name,
            known.priority,
        )
    return priority, known.name


async def over_submit_limits(reads: Reads, spec: JobSpec) -> Refused | None:
    """403 when the submission would pass a `max_submit_jobs` or `max_array_size` of
    its user, its account or the cluster (`gpuloom.queueing.limits`)."""
    return await _over(reads, [spec], lambda number, problem: problem)


async def over_batch_limits(reads: Reads, specs: Sequence[JobSpec]) -> Refused | None:
    """`over_submit_limits` of a batch, counted by its tasks: each job counts the
    batch's jobs before it. 403 names the first job (`jobs[i]`) that would pass a limit."""
    return await _over(reads, specs, lambda number, problem: f"jobs[{number}]: {problem}")


async def _over(
    reads: Reads, specs: Sequence[JobSpec], say: Callable[[int, str], str]
) -> Refused | None:
    """Hold `specs` to the limits. The gateway first folds its own writes where an
    operator set a limit that applies; the built-in defaults it checks against what it
    has folded, so that submissions never wait for them (admission holds them exactly)."""
    applying = {*OPERATOR_DEFAULTS, *(i for spec in specs for i in identities(spec)[:2])}
    if reads.submissions.limits_set_for(applying):
        await reads.fold_own_writes()
    over = reads.submissions.over_limit(specs)
    return Refused(403, say(*over)) if over is not None else None

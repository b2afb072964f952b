"""A submission's priority class, priority and limits, checked before it is published.

The rules are pure (`gpuloom.queueing.classes`, `.limits`, `gpuloom.auth.policy`); this module
reads the gateway's folded state and refuses (`refusals.Refused`): an unknown class, a class
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
from gpuloom.queueing.classes import class_named, class_use_problem, classes, default_class
from gpuloom.queueing.limits import active_counts, identities, submit_limit_problem
from gpuloom.state import ClusterState
from gpuloom.state.tenancy import CLUSTER_TOTAL
from services.gateway.deps import Gateway
from services.gateway.refusals import Refused, denied
from services.gateway.requests import JobRequest

log = logging.getLogger(__name__)

#: The limits an operator may set for everyone (they apply to every submission).
OPERATOR_DEFAULTS = (("default", "user"), ("default", "account"), CLUSTER_TOTAL)


def _state(gateway: Gateway) -> ClusterState:
    """The folded state (an empty one before the gateway read the log: no classes,
    no limits, the built-in class only)."""
    return gateway.read_model.state if gateway.read_model is not None else ClusterState()


def submission_class(
    request: JobRequest, user: str, principal: Principal, gateway: Gateway
) -> tuple[int, str] | Refused:
    """The priority and the priority class to publish: the request's class (or the
    default one) and its priority (the class's when the request gives none), once the
    caller may have them; else refused (403)."""
    state = _state(gateway)
    if request.priority_class is None:
        known = default_class(state)
    else:
        found = class_named(state, request.priority_class)
        if found is None:
            names = ", ".join(c.name for c in classes(state))
            reason = f"priority class {request.priority_class} does not exist (classes: {names})"
            return Refused(403, reason)
        known = found
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


async def over_submit_limits(gateway: Gateway, spec: JobSpec) -> Refused | None:
    """403 when the submission would pass a `max_submit_jobs` or `max_array_size` of
    its user, its account or the cluster (`gpuloom.queueing.limits`)."""
    return await _over(gateway, [spec], lambda number, problem: problem)


async def over_batch_limits(gateway: Gateway, specs: Sequence[JobSpec]) -> Refused | None:
    """`over_submit_limits` of a batch, counted by its tasks: each job counts the
    batch's jobs before it. 403 names the first job (`jobs[i]`) that would pass a limit."""
    return await _over(gateway, specs, lambda number, problem: f"jobs[{number}]: {problem}")


async def _over(
    gateway: Gateway, specs: Sequence[JobSpec], say: Callable[[int, str], str]
) -> Refused | None:
    """Hold `specs` to the limits. The gateway first folds its own writes where an
    operator set a limit that applies; the built-in defaults it checks against what it
    has folded, so that submissions never wait for them (admission holds them exactly)."""
    state = _state(gateway)
    applying = {*OPERATOR_DEFAULTS, *(i for spec in specs for i in identities(spec)[:2])}
    if not applying.isdisjoint(state.limits):
        await gateway.fold_own_writes()
        state = _state(gateway)
    counts = active_counts(state, with_submitted=True)
    for number, spec in enumerate(specs):
        adding = spec.array or 1
        problem = submit_limit_problem(state, spec.user, spec.account, adding, spec.array, counts)
        if problem is not None:
            return Refused(403, say(number, problem))
        for identity in identities(spec):
            counts[identity] += adding
    return None

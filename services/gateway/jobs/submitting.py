"""Submitting a job: what POST /v1/jobs and POST /v1/job-batches both check before they
write (the caller may submit it, a node could ever run it, its time limit, its
environment and the advance reservation it names), the event that submits it, what a retry with the same
Idempotency-Key finds, and the command of POST /v1/jobs as a whole (`submit`).

Each check returns its refusal (`refusals.Refused`, `Invalid`) rather than raising
it: the routes answer it (`refusals.answer`).
"""

from __future__ import annotations

from gpuloom.auth import Principal
from gpuloom.auth.policy import submit_problem
from gpuloom.config import Settings
from gpuloom.decide.admission import time_limit_problem
from gpuloom.events import Dependency, Event, JobArraySubmitted, JobSpec, JobSubmitted, intents
from gpuloom.events.codec import new_event_id
from gpuloom.events.jobs import CheckpointSignal, TopologyRequest
from gpuloom.events.text import reserved_env_reason
from services.gateway.jobs.requests import JobRequest, ReplicaRange
from services.gateway.jobs.submit_policy import over_submit_limits, submission_class
from services.gateway.publish import Publisher
from services.gateway.reads import Reads
from services.gateway.refusals import Invalid, Refusal, Refused, denied
from services.gateway.schemas import Submitted


async def submit(
    publisher: Publisher,
    reads: Reads,
    settings: Settings,
    request: JobRequest,
    principal: Principal,
    key: str | None,
) -> Submitted | Refusal:
    """POST /v1/jobs: the job (or job array) accepted once its event is acknowledged,
    the job an earlier request with the same `key` created, or the refusal."""
    spec = checked_spec(request, principal, reads, settings)
    if isinstance(spec, Refused | Invalid):
        return spec
    if key is not None:
        existing = await submitted_with(reads, key, principal, spec.user)
        if existing is not None:
            return existing
    over = await over_submit_limits(reads, spec)  # after: a retry finds its job, not the limit
    if over is not None:
        return over
    msg_id = intents.submitted(key) if key else None
    recorded = await publisher.publish(submission_event(spec, key), msg_id, principal=principal)
    if isinstance(recorded, Refused):
        return recorded
    return accepted(recorded.event, "submitted")


def checked_spec(
    request: JobRequest, principal: Principal, reads: Reads, settings: Settings
) -> JobSpec | Refusal:
    """The spec to publish for `request`, once the caller may submit it and some node
    could ever run it; else 403 or 422 (what both submission routes check)."""
    user = request.user or principal.name
    refused = denied(submit_problem(principal, user, request.account, reads.accounts()))
    if refused is not None:
        return refused
    decided = submission_class(request, user, principal, reads)
    if isinstance(decided, Refused):
        return decided
    spec = job_spec(request, user, *decided)
    invalid = (
        _time_limit_problem(spec, settings.max_time_limit_s)
        or _env_problem(spec)
        or _infeasible(reads, spec)
        or _reservation_problem(reads, spec)
    )
    return invalid if invalid is not None else spec


def job_spec(request: JobRequest, user: str, priority: int, priority_class: str) -> JobSpec:
    """The event payload of `request`, with its user, priority and class decided: the
    one place an HTTP body becomes a `JobSpec`, field by field, so that a field of
    either reaches the other on purpose (`requests.DECIDED`, `requests.LEFT_OUT`,
    `requests.RESHAPED`)."""
    replicas = request.replicas
    return JobSpec(
        name=request.name,
        user=user,
        account=request.account,
        command=list(request.command),
        gpus=request.gpus,
        gpu_milli=request.gpu_milli,
        gpu_memory_mib=request.gpu_memory_mib,
        gpu_model=list(request.gpu_model),
        cpu_milli=request.cpu_milli,
        memory_mib=request.memory_mib,
        pool=request.pool,
        locality=request.locality,
        node_selector=dict(request.node_selector),
        replicas=replicas.max if isinstance(replicas, ReplicaRange) else replicas,
        min_replicas=replicas.min if isinstance(replicas, ReplicaRange) else None,
        depends_on=[Dependency(job=d.job, when=d.when) for d in request.depends_on],
        array=request.array,
        priority=priority,
        priority_class=priority_class,
        preemptible=request.preemptible,
        time_limit_s=request.time_limit_s,
        env=dict(request.env),
        image=request.image,
        topology=(
            TopologyRequest(level=request.topology.level, mode=request.topology.mode)
            if request.topology is not None
            else None
        ),
        reservation=request.reservation,
        signal=(
            CheckpointSignal(name=request.signal.name, before_s=request.signal.before_s)
            if request.signal is not None
            else None
        ),
    )


def submission_event(spec: JobSpec, key: str | None) -> JobSubmitted | JobArraySubmitted:
    """The event that submits `spec`: a job, or a whole job array."""
    if spec.array is not None:
        return JobArraySubmitted(job_id=new_event_id(), spec=spec, idempotency_key=key)
    return JobSubmitted(job_id=new_event_id(), spec=spec, idempotency_key=key)


def _time_limit_problem(spec: JobSpec, maximum: int) -> Invalid | None:
    """422 over the cluster's MaxTime (admission rejects such a job that got by)."""
    reason = time_limit_problem(spec, maximum or None)
    if reason is None:
        return None
    return Invalid.at(("body", "time_limit_s"), reason, "less_than_equal")


def _infeasible(reads: Reads, spec: JobSpec) -> Invalid | None:
    """422 for a request no registered node could ever run (as sbatch refuses one at
    once), naming the field at fault; one that merely cannot run now is queued.

    Judged on the cluster as this gateway has read it; while it still reads the log at
    its start, or while no node is registered yet (a stack starting: its agents come
    a moment later), admission alone judges (it rejects such a job with the reason)."""
    found = reads.submissions.infeasible(spec)
    if found is None:
        return None
    field, why = found
    loc = ("body", field) if field is not None else ("body",)
    return Invalid.at(loc, f"no node could ever run this job: {why}")


def _reservation_problem(reads: Reads, spec: JobSpec) -> Invalid | None:
    """422 naming `reservation` for a job that may not run in the advance reservation it
    names (admission rejects such a job that got by, with the same reason)."""
    reason = reads.submissions.reservation_problem(spec)
    return Invalid.at(("body", "reservation"), reason) if reason is not None else None


def _env_problem(spec: JobSpec) -> Invalid | None:
    """422 naming each `env` variable the scheduler sets (`body.env.CUDA_VISIBLE_DEVICES`).

    Admission rejects such a job that got by; the contract itself still takes one
    (events already in a log must decode).
    """
    errors = tuple(
        {"loc": ("body", "env", name), "msg": f"{name} {reason}", "type": "value_error"}
        for name in sorted(spec.env)
        if (reason := reserved_env_reason(name)) is not None
    )
    return Invalid(errors) if errors else None


async def submitted_with(
    reads: Reads, key: str, principal: Principal, user: str
) -> Submitted | Refused | None:
    """What an earlier request with this idempotency key created, if the log has it.

    The log's de-duplication window catches a retry that races the first request;
    this catches one that comes after the window, from the folded state. A key that
    made another user's job is not theirs to learn about (refused: 409).
    """
    await reads.catch_up(principal.name)
    found = reads.submissions.keyed(key)
    if found is None:
        return None
    if found.owner is not None and found.owner[0] != user and not principal.operator:
        return Refused(409, "this Idempotency-Key was used by another user's job")
    if found.tasks is not None:
        return Submitted(id=found.job_id, state="submitted", tasks=found.tasks)
    return Submitted(id=found.job_id, state=found.phase or "submitted")


def accepted(event: Event, state: str) -> Submitted:
    if isinstance(event, JobArraySubmitted):
        return Submitted(id=event.job_id, state=state, tasks=event.task_ids())
    assert isinstance(event, JobSubmitted)
    return Submitted(id=event.job_id, state=state)

"""The one fold: `state = fold(events)`.

`apply` is total and deterministic. An event that is not valid at its position in
the log (placing on a GPU already taken, starting a cancelled job, a second final
event) changes nothing and is counted as voided, with its reason. Every process
uses this function, so all of them agree on what the log means.

For speed `apply` updates `state` in place and returns it; it never reads a clock,
randomness or anything outside its arguments. Time comes from envelopes (`at`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from datetime import datetime

from gpuloom.events import (
    Event,
    JobAdmitted,
    JobCancelled,
    JobCancelRequested,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobRejected,
    JobStarted,
    JobSubmitted,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeSpec,
    Recorded,
    UsageCharged,
)
from gpuloom.state.model import (
    VOIDED_KEPT,
    ClusterState,
    GpuState,
    JobPhase,
    JobState,
    NodeState,
    Run,
    Voided,
)


class Invalid(Exception):
    """Raised inside a handler to void the event; the message is the reason."""


def fold(events: Iterable[Recorded], state: ClusterState | None = None) -> ClusterState:
    """Apply `events` in order to `state` (a fresh state when None) and return it."""
    current = state if state is not None else ClusterState()
    for recorded in events:
        apply(current, recorded)
    return current


def apply(state: ClusterState, recorded: Recorded) -> ClusterState:
    """Apply one recorded event. Invalid events are voided, never raised."""
    state.seq = recorded.seq
    handler = _HANDLERS.get(type(recorded.event))
    try:
        if handler is None:
            raise Invalid(f"no fold rule for {recorded.envelope.type}")
        handler(state, recorded.event, recorded)
    except Invalid as why:
        state.voided += 1
        state.recent_voided.append(Voided(recorded.seq, recorded.envelope.type, str(why)))
        del state.recent_voided[:-VOIDED_KEPT]
    else:
        state.applied += 1
    return state


# --- helpers -------------------------------------------------------------------------


def _job(state: ClusterState, job_id: str) -> JobState:
    job = state.jobs.get(job_id)
    if job is None:
        raise Invalid(f"unknown job {job_id}")
    return job


def _require_phase(job: JobState, *phases: str) -> None:
    if job.phase not in phases:
        raise Invalid(f"job {job.job_id} is {job.phase}, not {'/'.join(phases)}")


def _set_phase(state: ClusterState, job: JobState, phase: JobPhase) -> None:
    """Move a job to `phase`, keeping the work-list indexes in step."""
    old = job.phase
    for index, member in (
        (state.submitted, "submitted"),
        (state.admitted, "admitted"),
        (state.queued, "queued"),
    ):
        if old == member:
            index.discard(job.job_id)
        if phase == member:
            index.add(job.job_id)
    if old in ("placed", "running") and phase not in ("placed", "running") and job.node:
        state.on_node.get(job.node, set()).discard(job.job_id)
    if phase in ("placed", "running") and job.node:
        state.on_node.setdefault(job.node, set()).add(job.job_id)
    job.phase = phase
    if job.is_final or phase in ("placed", "running"):
        state.cancel_pending.discard(job.job_id)


def _touch(job: JobState, recorded: Recorded) -> None:
    job.last_event_id = recorded.envelope.id
    job.last_seq = recorded.seq


def _release(state: ClusterState, job: JobState, at: datetime) -> None:
    """Free the job's GPUs and close its running run, if any."""
    node = state.nodes.get(job.node or "")
    if node is not None:
        for index in job.gpu_indexes:
            gpu = node.gpus.get(index)
            if gpu is not None and gpu.job_id == job.job_id:
                gpu.job_id = None
    run = job.current_run()
    if run is not None:
        run.ended_at = at
        state.uncharged.add(job.job_id)


# --- job events ----------------------------------------------------------------------


def _submitted(state: ClusterState, event: JobSubmitted, recorded: Recorded) -> None:
    if event.job_id in state.jobs:
        raise Invalid(f"job {event.job_id} already submitted")
    key = event.idempotency_key
    if key is not None and key in state.idempotency_keys:
        raise Invalid(f"idempotency key already used by job {state.idempotency_keys[key]}")
    job = JobState(
        job_id=event.job_id,
        spec=event.spec,
        phase="submitted",
        submitted_at=recorded.envelope.at,
        submit_seq=recorded.seq,
        idempotency_key=key,
        priority=event.spec.priority,
    )
    state.jobs[event.job_id] = job
    state.submitted.add(event.job_id)
    if key is not None:
        state.idempotency_keys[key] = event.job_id
    _touch(job, recorded)


def _admitted(state: ClusterState, event: JobAdmitted, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "submitted")
    _set_phase(state, job, "admitted")
    _touch(job, recorded)


def _rejected(state: ClusterState, event: JobRejected, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "submitted")
    _set_phase(state, job, "rejected")
    job.reason = event.reason
    job.finished_at = recorded.envelope.at
    _touch(job, recorded)


def _queued(state: ClusterState, event: JobQueued, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "admitted")
    job.priority = event.priority
    _set_phase(state, job, "queued")
    _touch(job, recorded)


def _cancel_requested(state: ClusterState, event: JobCancelRequested, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    if job.is_final:
        raise Invalid(f"job {job.job_id} already {job.phase}")
    job.cancel_requested = True
    if job.phase not in ("placed", "running"):
        state.cancel_pending.add(job.job_id)
    _touch(job, recorded)


def _cancelled(state: ClusterState, event: JobCancelled, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "submitted", "admitted", "queued", "placed")
    _release(state, job, recorded.envelope.at)
    _set_phase(state, job, "cancelled")
    job.reason = event.reason
    job.finished_at = recorded.envelope.at
    _touch(job, recorded)


def _placed(state: ClusterState, event: JobPlaced, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "queued")
    if job.cancel_requested:
        raise Invalid(f"job {job.job_id} has a cancel request")
    if event.attempt != job.attempt + 1:
        raise Invalid(f"attempt {event.attempt} but job {job.job_id} is at {job.attempt}")
    node = state.nodes.get(event.node)
    if node is None or node.phase != "ready":
        raise Invalid(f"node {event.node} is not ready")
    indexes = event.gpu_indexes
    if len(indexes) != job.spec.gpus or len(set(indexes)) != len(indexes):
        raise Invalid(f"job {job.job_id} needs {job.spec.gpus} distinct GPUs, got {indexes}")
    if len(event.gpu_uuids) != len(indexes):
        raise Invalid("gpu_uuids and gpu_indexes differ in length")
    for index, uuid in zip(indexes, event.gpu_uuids, strict=True):
        gpu = node.gpus.get(index)
        if gpu is None or gpu.uuid != uuid:
            raise Invalid(f"node {node.name} has no GPU {index} with uuid {uuid}")
        if gpu.job_id is not None:
            raise Invalid(f"GPU {node.name}/{index} is held by job {gpu.job_id}")
        if job.spec.gpu_model and gpu.model not in job.spec.gpu_model:
            raise Invalid(f"GPU {node.name}/{index} is a {gpu.model}, not {job.spec.gpu_model}")
    for index in indexes:
        node.gpus[index].job_id = job.job_id
    job.attempt = event.attempt
    job.node = event.node
    job.gpu_indexes = tuple(indexes)
    job.gpu_uuids = tuple(event.gpu_uuids)
    job.reason = None
    _set_phase(state, job, "placed")
    _touch(job, recorded)


def _require_current_attempt(job: JobState, attempt: int, node: str) -> None:
    if attempt != job.attempt or node != job.node:
        raise Invalid(
            f"attempt {attempt} on {node} is not job {job.job_id}'s current "
            f"attempt {job.attempt} on {job.node}"
        )


def _started(state: ClusterState, event: JobStarted, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "placed")
    _require_current_attempt(job, event.attempt, event.node)
    job.runs.append(
        Run(
            attempt=event.attempt,
            node=event.node,
            gpus=job.spec.gpus,
            started_at=recorded.envelope.at,
        )
    )
    if job.started_at is None:
        job.started_at = recorded.envelope.at
    _set_phase(state, job, "running")
    _touch(job, recorded)


def _finished(state: ClusterState, event: JobFinished, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "placed", "running")
    _require_current_attempt(job, event.attempt, event.node)
    _release(state, job, recorded.envelope.at)
    _set_phase(state, job, event.outcome)
    job.exit_code = event.exit_code
    job.reason = event.reason
    job.finished_at = recorded.envelope.at
    _touch(job, recorded)


def _charged(state: ClusterState, event: UsageCharged, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    ended = [run for run in job.runs if run.attempt == event.attempt and run.ended_at is not None]
    if not ended:
        raise Invalid(f"job {job.job_id} has no ended run for attempt {event.attempt}")
    if event.attempt in job.charged_attempts:
        raise Invalid(f"attempt {event.attempt} of job {job.job_id} already charged")
    job.charged_attempts.append(event.attempt)
    if all(run.attempt in job.charged_attempts for run in job.runs if run.ended_at is not None):
        state.uncharged.discard(job.job_id)
    account, user = job.spec.account, job.spec.user
    state.usage_by_account[account] = (
        state.usage_by_account.get(account, 0) + event.gpu_milli_seconds
    )
    state.usage_by_user[user] = state.usage_by_user.get(user, 0) + event.gpu_milli_seconds
    _touch(job, recorded)


# --- node events ---------------------------------------------------------------------


def registration_conflict(node: str, existing: NodeState | None, spec: NodeSpec) -> str | None:
    """Why registering `spec` for `node` over `existing` is not valid now, or None when it is.

    Shared by the fold (which voids such an event) and the inventory decision
    (which must not propose one), so the two can never disagree.
    """
    indexes = [gpu.index for gpu in spec.gpus]
    if len(set(indexes)) != len(indexes):
        return f"node {node} declares a GPU index twice"
    if existing is None:
        return None
    uuids = {gpu.index: gpu.uuid for gpu in spec.gpus}
    for index, gpu in sorted(existing.gpus.items()):
        if gpu.job_id is not None and uuids.get(index) != gpu.uuid:
            return f"GPU {node}/{index} is held by job {gpu.job_id}"
    return None


def _registered(state: ClusterState, event: NodeRegistered, recorded: Recorded) -> None:
    existing = state.nodes.get(event.node)
    conflict = registration_conflict(event.node, existing, event.spec)
    if conflict is not None:
        raise Invalid(conflict)
    gpus = {
        gpu.index: GpuState(gpu.index, gpu.uuid, gpu.model, gpu.memory_mib)
        for gpu in event.spec.gpus
    }
    if existing is not None:
        for index, gpu in existing.gpus.items():
            if gpu.job_id is not None:
                gpus[index].job_id = gpu.job_id
    state.nodes[event.node] = NodeState(
        name=event.node,
        phase="ready",
        spec=event.spec,
        gpus=gpus,
        registered_at=recorded.envelope.at,
    )


def _lost(state: ClusterState, event: NodeLost, recorded: Recorded) -> None:
    node = state.nodes.get(event.node)
    if node is None or node.phase != "ready":
        raise Invalid(f"node {event.node} is not ready")
    node.phase = "lost"
    node.lost_at = recorded.envelope.at
    for job_id in sorted(state.on_node.get(event.node, set())):
        job = state.jobs[job_id]
        _release(state, job, recorded.envelope.at)
        if job.cancel_requested:
            _set_phase(state, job, "cancelled")
            job.reason = f"node {event.node} lost while cancelling"
            job.finished_at = recorded.envelope.at
        else:
            _set_phase(state, job, "queued")
            job.reason = f"requeued: node {event.node} lost ({event.reason})"
        job.node = None
        job.gpu_indexes = ()
        job.gpu_uuids = ()
        _touch(job, recorded)


def _recovered(state: ClusterState, event: NodeRecovered, recorded: Recorded) -> None:
    node = state.nodes.get(event.node)
    if node is None or node.phase != "lost":
        raise Invalid(f"node {event.node} is not lost")
    node.phase = "ready"
    node.lost_at = None


Handler = Callable[[ClusterState, Event, Recorded], None]

_HANDLERS: dict[type[Event], Handler] = {
    JobSubmitted: _submitted,  # type: ignore[dict-item]
    JobAdmitted: _admitted,  # type: ignore[dict-item]
    JobRejected: _rejected,  # type: ignore[dict-item]
    JobQueued: _queued,  # type: ignore[dict-item]
    JobCancelRequested: _cancel_requested,  # type: ignore[dict-item]
    JobCancelled: _cancelled,  # type: ignore[dict-item]
    JobPlaced: _placed,  # type: ignore[dict-item]
    JobStarted: _started,  # type: ignore[dict-item]
    JobFinished: _finished,  # type: ignore[dict-item]
    UsageCharged: _charged,  # type: ignore[dict-item]
    NodeRegistered: _registered,  # type: ignore[dict-item]
    NodeLost: _lost,  # type: ignore[dict-item]
    NodeRecovered: _recovered,  # type: ignore[dict-item]
}

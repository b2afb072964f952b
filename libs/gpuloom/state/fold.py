"""The one fold: `state = fold(events)`.

`apply` is total and deterministic. An event that is not valid at its position in
the log (placing on a GPU already taken, starting a cancelled job, a second final
event) changes nothing and is counted as voided, with its reason. Every process
uses this function, so all of them agree on what the log means.

For speed `apply` updates `state` in place and returns it; it never reads a clock,
randomness or anything outside its arguments. Time comes from envelopes (`at`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta

from gpuloom.events import (
    AccountCoordinatorsSet,
    AccountCreated,
    AccountUsersSet,
    AuditCompleted,
    Event,
    GpuPoolChanged,
    JobAdmitted,
    JobArraySubmitted,
    JobCancelled,
    JobCancelRequested,
    JobFinished,
    JobPlaced,
    JobPreempted,
    JobQueued,
    JobRejected,
    JobReserved,
    JobSpec,
    JobStarted,
    JobSubmitted,
    NodeCordoned,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeSpec,
    NodeUncordoned,
    QueuePolicySet,
    QuotaSet,
    Recorded,
    ReplicaAssignment,
    SharesSet,
    SliceRef,
    UsageCharged,
)
from gpuloom.state.errors import Invalid
from gpuloom.state.model import (
    VOIDED_KEPT,
    AccountState,
    ClusterState,
    GpuState,
    JobPhase,
    JobState,
    NodeState,
    Run,
    Voided,
)
from gpuloom.state.policies import POLICY_HANDLERS
from gpuloom.state.retention import (
    expire,
    known,
    retire_if_done,
    spec_submitted,
    task_added,
    unknown_job,
)
from gpuloom.state.usage import DecayedUsage

WHOLE_GPU = 1000
#: How far an event's `at` may be from the log's own timestamp of it: writers' clocks
#: (NTP keeps them within a second) and publish retries, with a wide margin.
MAX_CLOCK_SKEW = timedelta(minutes=5)


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
        at = recorded.envelope.at
        if at.tzinfo is None or at.utcoffset() is None:
            raise Invalid("the envelope's time has no time zone")
        stored = recorded.stored_at
        if stored is not None and abs(at - stored) > MAX_CLOCK_SKEW:
            recorded = _clamped(state, recorded, stored)
            at = recorded.envelope.at
        handler(state, recorded.event, recorded)
    except Invalid as why:
        _void(state, recorded, str(why), fault=False)
    except Exception as exc:  # containment: one bad event must never stop a fold
        # A rule failed where its checks did not expect it. Rules mostly check before
        # they change anything, so the event is voided like an invalid one (a rule that
        # failed half-way leaves what it changed, the same in every service); the fault
        # is counted apart so that services dead-letter the event and an operator sees it.
        _void(state, recorded, f"fold rule failed: {type(exc).__name__}: {exc}", fault=True)
    else:
        state.applied += 1
        if state.clock is None or at > state.clock:
            state.clock = at  # the log's time: the latest applied event
            expire(state)  # tombstones past their window (retention.py)
    return state


def _clamped(state: ClusterState, recorded: Recorded, stored: datetime) -> Recorded:
    """The event with its time moved to within MAX_CLOCK_SKEW of when the log stored it.

    A fact is kept (a JobFinished from a host whose clock drifted is still true), but
    a writer's clock, or a forged time, cannot move the log's clock (ageing, decay,
    reservations, charges) by more than the bound. Counted, and kept for inspection.
    """
    at = recorded.envelope.at
    bounded = min(max(at, stored - MAX_CLOCK_SKEW), stored + MAX_CLOCK_SKEW)
    state.skewed += 1
    state.recent_skewed.append(
        Voided(
            recorded.seq,
            recorded.envelope.type,
            f"time {at.isoformat()} is {abs(at - stored).total_seconds():.0f} s from when the "
            f"log stored it; taken as {bounded.isoformat()}",
        )
    )
    del state.recent_skewed[:-VOIDED_KEPT]
    envelope = recorded.envelope.model_copy(update={"at": bounded})
    return dataclasses.replace(recorded, envelope=envelope)


def _void(state: ClusterState, recorded: Recorded, reason: str, *, fault: bool) -> None:
    state.voided += 1
    state.faults += fault
    state.recent_voided.append(Voided(recorded.seq, recorded.envelope.type, reason, fault))
    del state.recent_voided[:-VOIDED_KEPT]


# --- helpers -------------------------------------------------------------------------


def _job(state: ClusterState, job_id: str) -> JobState:
    job = state.jobs.get(job_id)
    if job is None:
        raise Invalid(unknown_job(state, job_id))
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
    if old in ("placed", "running") and phase not in ("placed", "running"):
        for name in job.nodes_held():
            state.on_node.get(name, set()).discard(job.job_id)
    if phase in ("placed", "running"):
        for name in job.nodes_held():
            state.on_node.setdefault(name, set()).add(job.job_id)
    job.phase = phase
    if job.is_final or phase in ("placed", "running"):
        state.cancel_pending.discard(job.job_id)


def _touch(job: JobState, recorded: Recorded) -> None:
    job.last_event_id = recorded.envelope.id
    job.last_seq = recorded.seq


def _release(
    state: ClusterState, job: JobState, at: datetime, ended: datetime | None = None
) -> None:
    """Free everything the job's placement holds and close its running run, if any.

    The run ends at `at` (the event's time), or at `ended`, when the process really
    ended as its node saw it (reported late when the agent was down). `ended` is a
    node's claim, so it is kept within what the log knows: not after `at` (no run
    is charged past its report) and not before the run's start, nor before an
    interim charge already billed (charges are never taken back, and the run's
    charges must add up to its time)."""
    for name in job.nodes_held():
        node = state.nodes.get(name)
        if node is None:
            continue
        node.hosted.pop(job.job_id, None)
        for gpu in node.gpus.values():
            gpu.holders.pop(job.job_id, None)
    run = job.current_run()
    if run is not None:
        end = at
        if ended is not None and ended.utcoffset() is not None:
            end = min(max(ended, run.charged_until or run.started_at), at)
        run.ended_at = end
        state.uncharged.add(job.job_id)
        _add_fair_share_usage(state, job.spec.account, run.gpu_milli_seconds(), end)


def _add_fair_share_usage(state: ClusterState, account: str, amount: int, at: datetime) -> None:
    """Fair share counts a run's GPU time when it ends (the charge event comes later, from
    another service: the next placement cycle must not see the account as idle meanwhile)."""
    half_life = (state.queue_policy or QueuePolicySet()).fair_share_half_life_s
    usage = state.decayed_usage.setdefault(account, DecayedUsage(half_life))
    usage.add(amount, max(usage.at, at.timestamp()))


def _forget_placement(state: ClusterState, job: JobState) -> None:
    """After `_release` and the phase change: the job holds nothing anywhere."""
    job.node = None
    job.gpu_indexes = ()
    job.gpu_uuids = ()
    job.replicas = ()
    job.started_replicas = set()
    job.finished_replicas = {}
    job.preempted_by = None
    job.preempted_at = None


# --- job events ----------------------------------------------------------------------


def _submitted(state: ClusterState, event: JobSubmitted, recorded: Recorded) -> None:
    if known(state, event.job_id) or event.job_id in state.arrays:
        raise Invalid(f"job {event.job_id} already submitted")
    key = event.idempotency_key
    if key is not None and key in state.idempotency_keys:
        raise Invalid(f"idempotency key already used by job {state.idempotency_keys[key]}")
    _add_job(state, event.job_id, event.spec, recorded, key, event.array_id, event.array_index)
    if event.array_id is not None and event.array_index is not None:
        tasks = state.arrays.get(event.array_id, 0)
        state.arrays[event.array_id] = max(tasks, event.array_index + 1)
        task_added(state, event.array_id)


def _array_submitted(state: ClusterState, event: JobArraySubmitted, recorded: Recorded) -> None:
    """Every task at once, or (voided) none."""
    if known(state, event.job_id) or event.job_id in state.arrays:
        raise Invalid(f"job {event.job_id} already submitted")
    key = event.idempotency_key
    if key is not None and key in state.idempotency_keys:
        raise Invalid(f"idempotency key already used by job {state.idempotency_keys[key]}")
    tasks = event.task_ids()
    taken = [task for task in tasks if known(state, task)]
    if taken:
        raise Invalid(f"task {taken[0]} already submitted")
    task_spec = event.spec.model_copy(update={"array": None})
    for index, task in enumerate(tasks):
        _add_job(state, task, task_spec, recorded, None, event.job_id, index)
        task_added(state, event.job_id, key)
    state.arrays[event.job_id] = len(tasks)
    if key is not None:
        state.idempotency_keys[key] = event.job_id


def _add_job(
    state: ClusterState,
    job_id: str,
    spec: JobSpec,
    recorded: Recorded,
    key: str | None,
    array_id: str | None,
    array_index: int | None,
) -> None:
    job = JobState(
        job_id=job_id,
        spec=spec,
        phase="submitted",
        submitted_at=recorded.envelope.at,
        submit_seq=recorded.seq,
        idempotency_key=key,
        priority=spec.priority,
        array_id=array_id,
        array_index=array_index,
    )
    state.jobs[job_id] = job
    state.submitted.add(job_id)
    for dependency in spec.depends_on:
        state.dependents.setdefault(dependency.job, set()).add(job_id)
    if key is not None:
        state.idempotency_keys[key] = job_id
    spec_submitted(state, job)
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
    retire_if_done(state, job, recorded.envelope.at)


def _queued(state: ClusterState, event: JobQueued, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "admitted")
    job.priority = event.priority
    _set_phase(state, job, "queued")
    _touch(job, recorded)


def _cancel_requested(state: ClusterState, event: JobCancelRequested, recorded: Recorded) -> None:
    if event.job_id not in state.jobs and event.job_id in state.arrays:
        _cancel_array(state, event.job_id, recorded)
        return
    job = _job(state, event.job_id)
    if job.is_final:
        raise Invalid(f"job {job.job_id} already {job.phase}")
    _request_cancel(state, job, recorded)


def _cancel_array(state: ClusterState, array_id: str, recorded: Recorded) -> None:
    """`scancel <array id>`: every task that has not ended (voided if none is left)."""
    tasks = (state.jobs.get(task) for task in state.array_tasks(array_id))
    live = [job for job in tasks if job is not None and not job.is_final]
    if not live:
        raise Invalid(f"every task of array {array_id} has ended")
    for job in live:
        _request_cancel(state, job, recorded)


def _request_cancel(state: ClusterState, job: JobState, recorded: Recorded) -> None:
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
    retire_if_done(state, job, recorded.envelope.at)


def _placed(state: ClusterState, event: JobPlaced, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "queued")
    if job.cancel_requested:
        raise Invalid(f"job {job.job_id} has a cancel request")
    if event.attempt != job.attempt + 1:
        raise Invalid(f"attempt {event.attempt} but job {job.job_id} is at {job.attempt}")
    replicas = event.assignments()
    problem = assignment_problem(state, job.spec, replicas)
    if problem is not None:
        raise Invalid(problem)
    first = replicas[0]
    local = [piece for piece in first.slices if piece.node == first.host]
    if event.node != first.host or event.gpu_indexes != [p.index for p in local]:
        raise Invalid("node and gpu_indexes must be replica 0's host and its local GPUs")
    for replica in replicas:
        host = state.nodes[replica.host]
        host.hosted[job.job_id] = (
            host.hosted.get(job.job_id, (0, 0))[0] + replica.cpu_milli,
            host.hosted.get(job.job_id, (0, 0))[1] + replica.memory_mib,
        )
        for piece in replica.slices:
            gpu = state.nodes[piece.node].gpus[piece.index]
            milli, memory = gpu.holders.get(job.job_id, (0, 0))
            gpu.holders[job.job_id] = (milli + piece.milli, memory + _slice_memory(gpu, piece))
    job.attempt = event.attempt
    job.node = event.node
    job.gpu_indexes = tuple(event.gpu_indexes)
    job.gpu_uuids = tuple(event.gpu_uuids)
    job.replicas = tuple(replicas)
    job.started_replicas = set()
    job.finished_replicas = {}
    job.reason = None
    job.placed_at = recorded.envelope.at
    job.placed_seq = recorded.seq
    if state.reservation is not None and state.reservation.job_id == job.job_id:
        state.reservation = None
    _set_phase(state, job, "placed")
    _touch(job, recorded)


def _reserved(state: ClusterState, event: JobReserved, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "queued")
    state.reservation = event
    _touch(job, recorded)


def _preempted(state: ClusterState, event: JobPreempted, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "placed", "running")
    if event.attempt != job.attempt:
        raise Invalid(f"attempt {event.attempt} is not job {job.job_id}'s current {job.attempt}")
    if job.preempted_by is not None:
        raise Invalid(f"job {job.job_id} is already preempted by {job.preempted_by}")
    if not known(state, event.by):
        raise Invalid(f"preempting job {event.by} does not exist")
    job.preempted_by = event.by
    job.preempted_at = recorded.envelope.at
    job.reason = f"Preempted by {event.by} ({event.reason}): stopping, then requeued"
    _touch(job, recorded)


def _slice_memory(gpu: GpuState, piece: SliceRef) -> int:
    return gpu.slice_memory(piece.milli, piece.memory_mib)


def assignment_problem(
    state: ClusterState, spec: JobSpec, replicas: list[ReplicaAssignment]
) -> str | None:
    """Why `replicas` is not a valid placement of `spec` in `state`, or None.

    The rules of docs/placement.md: replica count, hosts ready with CPU and
    memory room, one slice per GPU per replica, GPU model, pool (fractions from
    vgpu, physical GPUs whole and local), locality, lenders, and no GPU over
    1000 milli or its memory.
    """
    if len(replicas) != spec.replicas:
        return f"{len(replicas)} replicas placed, the job has {spec.replicas}"
    share = spec.share_milli
    cpu_taken: dict[str, int] = {}
    memory_taken: dict[str, int] = {}
    gpu_taken: dict[tuple[str, int], tuple[int, int]] = {}
    for number, replica in enumerate(replicas):
        host = state.nodes.get(replica.host)
        if host is None or host.phase != "ready":
            return f"replica {number}: host {replica.host} is not ready"
        if replica.cpu_milli != spec.cpu_milli or replica.memory_mib != spec.memory_mib:
            return f"replica {number}: CPU/memory differ from the job's request"
        if spec.node_selector and any(
            host.spec.labels.get(k) != v for k, v in spec.node_selector.items()
        ):
            return f"replica {number}: host {host.name} does not match the node selector"
        cpu_taken[host.name] = cpu_taken.get(host.name, 0) + replica.cpu_milli
        memory_taken[host.name] = memory_taken.get(host.name, 0) + replica.memory_mib
        if host.spec.cpu_milli and host.cpu_used + cpu_taken[host.name] > host.spec.cpu_milli:
            return f"replica {number}: host {host.name} has not enough free CPU"
        if (
            host.spec.memory_mib
            and host.memory_used + memory_taken[host.name] > host.spec.memory_mib
        ):
            return f"replica {number}: host {host.name} has not enough free memory"
        if len(replica.slices) != spec.gpus:
            return f"replica {number}: {len(replica.slices)} GPU slices, the job needs {spec.gpus}"
        seen: set[tuple[str, int]] = set()
        for piece in replica.slices:
            where = f"GPU {piece.node}/{piece.index}"
            if (piece.node, piece.index) in seen:
                return f"replica {number}: {where} given twice"
            seen.add((piece.node, piece.index))
            node = state.nodes.get(piece.node)
            if node is None or node.phase != "ready":
                return f"replica {number}: node {piece.node} is not ready"
            gpu = node.gpus.get(piece.index)
            if gpu is None or gpu.uuid != piece.uuid:
                return (
                    f"replica {number}: node {piece.node} has no GPU {piece.index} ({piece.uuid})"
                )
            if spec.gpu_model and gpu.model not in spec.gpu_model:
                return f"replica {number}: {where} is a {gpu.model}, not {spec.gpu_model}"
            if piece.milli != share:
                return (
                    f"replica {number}: {where} slice of {piece.milli} milli, the job asks {share}"
                )
            if spec.pool != "any" and gpu.pool != spec.pool:
                return f"replica {number}: {where} is in the {gpu.pool} pool, not {spec.pool}"
            if share < WHOLE_GPU and gpu.pool != "vgpu":
                return f"replica {number}: {where} is physical: fractions come from vgpu"
            if piece.node != replica.host:
                if gpu.pool == "physical":
                    return f"replica {number}: physical {where} cannot be remote"
                if spec.locality == "local-only":
                    return f"replica {number}: {where} is remote but the job is local-only"
                if not node.spec.lends_remote_vgpu:
                    return f"replica {number}: node {piece.node} does not lend remote vGPU"
            milli, memory = gpu_taken.get((piece.node, piece.index), (0, 0))
            milli += piece.milli
            memory += _slice_memory(gpu, piece)
            gpu_taken[(piece.node, piece.index)] = (milli, memory)
            if share >= WHOLE_GPU and not gpu.idle:
                return f"replica {number}: {where} is held by job {gpu.job_id}"
            if gpu.milli_used + milli > WHOLE_GPU or gpu.memory_used + memory > gpu.memory_mib:
                return f"replica {number}: {where} has not enough free share or memory"
    return None


def _require_current_attempt(job: JobState, attempt: int, node: str, replica: int) -> None:
    if attempt != job.attempt:
        raise Invalid(f"attempt {attempt} is not job {job.job_id}'s current attempt {job.attempt}")
    if replica >= len(job.replicas) or job.replicas[replica].host != node:
        raise Invalid(f"replica {replica} of job {job.job_id} is not hosted on {node}")


def _started(state: ClusterState, event: JobStarted, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "placed", "running")
    _require_current_attempt(job, event.attempt, event.node, event.replica)
    if event.replica in job.started_replicas or event.replica in job.finished_replicas:
        raise Invalid(f"replica {event.replica} of job {job.job_id} already started")
    job.started_replicas.add(event.replica)
    if job.phase == "placed":
        job.runs.append(
            Run(
                attempt=event.attempt,
                node=event.node,
                gpus=job.spec.gpus * job.spec.replicas,
                started_at=recorded.envelope.at,
                gpu_milli=sum(p.milli for r in job.replicas for p in r.slices),
                milli_by_model=_milli_by_model(state, job),
            )
        )
        if job.started_at is None:
            job.started_at = recorded.envelope.at
        _set_phase(state, job, "running")
    _touch(job, recorded)


def _milli_by_model(state: ClusterState, job: JobState) -> dict[str, int]:
    by_model: dict[str, int] = {}
    for replica in job.replicas:
        for piece in replica.slices:
            gpu = state.nodes[piece.node].gpus.get(piece.index)
            model = gpu.model if gpu is not None else "unknown"
            by_model[model] = by_model.get(model, 0) + piece.milli
    return dict(sorted(by_model.items()))


#: When replicas end differently, the job ends as the first of these any replica had.
_OUTCOME_ORDER = ("cancelled", "preempted", "timed_out", "failed", "succeeded")


def _finished(state: ClusterState, event: JobFinished, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    _require_phase(job, "placed", "running")
    _require_current_attempt(job, event.attempt, event.node, event.replica)
    if event.replica in job.finished_replicas:
        raise Invalid(f"replica {event.replica} of job {job.job_id} already finished")
    if event.outcome == "preempted" and job.preempted_by is None:
        raise Invalid(f"job {job.job_id} was not preempted")
    job.finished_replicas[event.replica] = (event.outcome, event.exit_code, event.reason)
    _touch(job, recorded)
    if len(job.finished_replicas) < len(job.replicas):
        return
    ends = [job.finished_replicas[r] for r in sorted(job.finished_replicas)]
    outcome = min((end[0] for end in ends), key=_OUTCOME_ORDER.index)
    first_bad = next((end for end in ends if end[0] == outcome), ends[0])
    # A gang's run ends with its last replica, which need not be the last reported:
    # only a single replica's own end time is the run's end.
    ended = event.ended_at if len(job.replicas) == 1 else None
    _release(state, job, recorded.envelope.at, ended)
    if outcome == "preempted" and not job.cancel_requested:
        by = job.preempted_by
        _set_phase(state, job, "queued")
        _forget_placement(state, job)
        job.reason = f"requeued: preempted by {by}"
        return
    if outcome == "preempted":
        outcome, first_bad = "cancelled", ("cancelled", first_bad[1], "cancelled while preempted")
    _set_phase(state, job, outcome)  # type: ignore[arg-type]
    job.exit_code = first_bad[1]
    job.reason = first_bad[2]
    job.finished_at = recorded.envelope.at
    retire_if_done(state, job, recorded.envelope.at)


def _charged(state: ClusterState, event: UsageCharged, recorded: Recorded) -> None:
    job = _job(state, event.job_id)
    runs = [run for run in job.runs if run.attempt == event.attempt]
    if not runs:
        raise Invalid(f"job {job.job_id} has no run for attempt {event.attempt}")
    run = runs[-1]
    if event.attempt in job.charged_attempts:
        raise Invalid(f"attempt {event.attempt} of job {job.job_id} already charged")
    if event.part != run.charges:
        raise Invalid(f"charge part {event.part}, but attempt {event.attempt} has {run.charges}")
    if event.period_end is None:
        if run.ended_at is None:
            raise Invalid(f"attempt {event.attempt} of job {job.job_id} has not ended")
        job.charged_attempts.append(event.attempt)
        if all(r.attempt in job.charged_attempts for r in job.runs if r.ended_at is not None):
            state.uncharged.discard(job.job_id)
    else:
        since = run.charged_until or run.started_at
        if event.period_end <= since:
            raise Invalid(f"interim charge up to {event.period_end} does not pass {since}")
        run.charged_until = event.period_end
    run.charges += 1
    run.charged_milli_seconds += event.gpu_milli_seconds
    for model, amount in event.by_model.items():
        run.charged_by_model[model] = run.charged_by_model.get(model, 0) + amount
    account, user = job.spec.account, job.spec.user
    state.usage_by_account[account] = (
        state.usage_by_account.get(account, 0) + event.gpu_milli_seconds
    )
    state.usage_by_user[user] = state.usage_by_user.get(user, 0) + event.gpu_milli_seconds
    _touch(job, recorded)
    retire_if_done(state, job, recorded.envelope.at)


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
        if not gpu.idle and uuids.get(index) != gpu.uuid:
            return f"GPU {node}/{index} is held by job {gpu.job_id}"
    return None


def _registered(state: ClusterState, event: NodeRegistered, recorded: Recorded) -> None:
    existing = state.nodes.get(event.node)
    conflict = registration_conflict(event.node, existing, event.spec)
    if conflict is not None:
        raise Invalid(conflict)
    overrides = existing.pool_overrides if existing is not None else {}
    gpus = {
        gpu.index: GpuState(
            gpu.index, gpu.uuid, gpu.model, gpu.memory_mib, overrides.get(gpu.index, gpu.pool)
        )
        for gpu in event.spec.gpus
    }
    if existing is not None:
        for index, gpu in existing.gpus.items():
            if index in gpus and gpus[index].uuid == gpu.uuid:
                gpus[index].holders = gpu.holders
                gpus[index].pool = gpu.pool
    state.nodes[event.node] = NodeState(
        name=event.node,
        phase="ready",
        spec=event.spec,
        gpus=gpus,
        registered_at=recorded.envelope.at,
        pool_overrides={i: p for i, p in overrides.items() if i in gpus},
        hosted=existing.hosted if existing is not None else {},
        cordoned=existing.cordoned if existing is not None else False,
        cordon_reason=existing.cordon_reason if existing is not None else "",
    )


def _cordoned(state: ClusterState, event: NodeCordoned, recorded: Recorded) -> None:
    node = state.nodes.get(event.node)
    if node is None:
        raise Invalid(f"node {event.node} does not exist")
    node.cordoned = True
    node.cordon_reason = event.reason


def _uncordoned(state: ClusterState, event: NodeUncordoned, recorded: Recorded) -> None:
    node = state.nodes.get(event.node)
    if node is None or not node.cordoned:
        raise Invalid(f"node {event.node} is not cordoned")
    node.cordoned = False
    node.cordon_reason = ""


def _pool_changed(state: ClusterState, event: GpuPoolChanged, recorded: Recorded) -> None:
    node = state.nodes.get(event.node)
    if node is None:
        raise Invalid(f"unknown node {event.node}")
    gpu = node.gpus.get(event.index)
    if gpu is None:
        raise Invalid(f"node {event.node} has no GPU {event.index}")
    if not gpu.idle:
        raise Invalid(
            f"GPU {event.node}/{event.index} is in use by {', '.join(sorted(gpu.holders))}"
        )
    gpu.pool = event.pool
    node.pool_overrides[event.index] = event.pool


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
        _forget_placement(state, job)
        _touch(job, recorded)
        retire_if_done(state, job, recorded.envelope.at)


def _recovered(state: ClusterState, event: NodeRecovered, recorded: Recorded) -> None:
    node = state.nodes.get(event.node)
    if node is None or node.phase != "lost":
        raise Invalid(f"node {event.node} is not lost")
    node.phase = "ready"
    node.lost_at = None


def _account_created(state: ClusterState, event: AccountCreated, recorded: Recorded) -> None:
    if event.account in state.accounts:
        raise Invalid(f"account {event.account} already exists")
    if event.parent is not None and event.parent not in state.accounts:
        raise Invalid(f"parent account {event.parent} does not exist")
    state.accounts[event.account] = AccountState(
        event.account, event.parent, description=event.description
    )


def _shares_set(state: ClusterState, event: SharesSet, recorded: Recorded) -> None:
    account = state.accounts.get(event.account)
    if account is None:
        raise Invalid(f"account {event.account} does not exist")
    account.shares = event.shares


def _users_set(state: ClusterState, event: AccountUsersSet, recorded: Recorded) -> None:
    account = state.accounts.get(event.account)
    if account is None:
        raise Invalid(f"account {event.account} does not exist")
    account.users = tuple(event.users)


def _coordinators_set(
    state: ClusterState, event: AccountCoordinatorsSet, recorded: Recorded
) -> None:
    account = state.accounts.get(event.account)
    if account is None:
        raise Invalid(f"account {event.account} does not exist")
    account.coordinators = tuple(event.coordinators)


def _quota_set(state: ClusterState, event: QuotaSet, recorded: Recorded) -> None:
    account = state.accounts.get(event.account)
    if account is None:
        raise Invalid(f"account {event.account} does not exist")
    if event.nominal is None:
        account.quotas.pop(event.resource, None)
    else:
        account.quotas[event.resource] = (event.nominal, event.borrowing_limit, event.cap)


def _queue_policy(state: ClusterState, event: QueuePolicySet, recorded: Recorded) -> None:
    state.queue_policy = event
    for usage in state.decayed_usage.values():
        usage.half_life_s = event.fair_share_half_life_s


def _audited(state: ClusterState, event: AuditCompleted, recorded: Recorded) -> None:
    if event.to_seq >= recorded.seq:
        raise Invalid(f"an audit cannot cover seq {event.to_seq}, at or after its own")
    state.last_audit = event


Handler = Callable[[ClusterState, Event, Recorded], None]

_HANDLERS: dict[type[Event], Handler] = {
    JobSubmitted: _submitted,  # type: ignore[dict-item]
    JobAdmitted: _admitted,  # type: ignore[dict-item]
    JobRejected: _rejected,  # type: ignore[dict-item]
    JobQueued: _queued,  # type: ignore[dict-item]
    JobArraySubmitted: _array_submitted,  # type: ignore[dict-item]
    JobCancelRequested: _cancel_requested,  # type: ignore[dict-item]
    JobCancelled: _cancelled,  # type: ignore[dict-item]
    JobPlaced: _placed,  # type: ignore[dict-item]
    JobReserved: _reserved,  # type: ignore[dict-item]
    JobPreempted: _preempted,  # type: ignore[dict-item]
    JobStarted: _started,  # type: ignore[dict-item]
    JobFinished: _finished,  # type: ignore[dict-item]
    UsageCharged: _charged,  # type: ignore[dict-item]
    NodeRegistered: _registered,  # type: ignore[dict-item]
    NodeLost: _lost,  # type: ignore[dict-item]
    NodeRecovered: _recovered,  # type: ignore[dict-item]
    GpuPoolChanged: _pool_changed,  # type: ignore[dict-item]
    NodeCordoned: _cordoned,  # type: ignore[dict-item]
    NodeUncordoned: _uncordoned,  # type: ignore[dict-item]
    AuditCompleted: _audited,  # type: ignore[dict-item]
    QueuePolicySet: _queue_policy,  # type: ignore[dict-item]
    AccountCreated: _account_created,  # type: ignore[dict-item]
    SharesSet: _shares_set,  # type: ignore[dict-item]
    QuotaSet: _quota_set,  # type: ignore[dict-item]
    AccountUsersSet: _users_set,  # type: ignore[dict-item]
    AccountCoordinatorsSet: _coordinators_set,  # type: ignore[dict-item]
    **POLICY_HANDLERS,
}

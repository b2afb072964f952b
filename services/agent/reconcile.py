"""What the agent must do: a pure function of the folded state and its local processes.

`reconcile(state, nodes, local)` compares the jobs the log puts on the served
`nodes` with the processes the agent holds (`local`, keyed by `(job_id,
attempt)`) and returns the actions that bring them in line. It reads no clock
and no file, and iterates nodes and job ids in sorted order, so the same inputs
always give the same actions in the same order. Being level triggered, it is
safe to call again with the same inputs: every event it asks for carries a
deterministic msg id, and the shell makes every action idempotent.

Rules, for each served node and each job on it (phase placed or running) at its
current attempt:

* no local process: placed with a cancel request (or preempted, or on a GPU that
  failed) -> report it cancelled (preempted) before start; otherwise -> `Ensure` (adopt, report from
  its run folder, or start it).
* an orphan (a live shim found at start-up) -> `Ensure` (adopt it).
* running locally with a cancel request, preempted or on a GPU that failed -> `Stop`
  (outcome `cancelled` or `preempted`: the fold requeues a preempted run); an elastic
  gang's replica a shrink told to leave -> `Stop` it alone (`preempted`, the gang runs
  on); placed -> report `JobStarted` (again, until the log shows it).
* stopping, exited -> nothing: its watcher reports the end.

And for each local process whose attempt is no longer placed or running on its
node in the log (requeued, cancelled, superseded): `Drop` it silently while it
lives, `Forget` it once it has exited.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum

from gpuloom.events import Decision, JobFinished, JobSpec, JobStarted, Outcome, SliceRef, intents
from gpuloom.state import ON_NODE_PHASES, ClusterState, JobState

#: (job id, attempt, replica): one local process.
JobKey = tuple[str, int, int]


class Status(StrEnum):
    """What the agent knows about one local process."""

    #: Started or adopted by this agent, watched, time limit armed.
    RUNNING = "running"
    #: Being stopped for a reason (cancel, time limit) that will be reported.
    STOPPING = "stopping"
    #: Being killed silently: its job is no longer here.
    DROPPING = "dropping"
    #: Ended; its end is reported (or about to be) by the outbox.
    EXITED = "exited"
    #: A live shim found in the run folders at start-up, not adopted yet.
    ORPHAN = "orphan"


@dataclass(frozen=True, slots=True)
class Local:
    node: str
    pid: int
    status: Status
    #: Replica 0 of a gang: the rendezvous its agent reserved.
    master: tuple[str, int] | None = None


@dataclass(frozen=True, slots=True)
class Ensure:
    """Make this attempt run here: adopt its shim, report its end, or start it."""

    job_id: str
    attempt: int
    node: str
    phase: str  # "placed" or "running"
    spec: JobSpec
    gpu_indexes: tuple[int, ...]
    gpu_uuids: tuple[str, ...]
    #: When the log says this attempt started (JobStarted), to re-arm its time limit.
    started_at: datetime | None
    #: Every GPU slice of the replica (local and remote), for the sharing variables.
    slices: tuple[SliceRef, ...] = ()
    replica: int = 0
    #: Hosts of every replica of the gang, in replica order (for rendezvous).
    hosts: tuple[str, ...] = ()
    #: The gang's rendezvous, for replicas but 0 (whose agent reserves it).
    master: tuple[str, int] | None = None
    #: For a task of a job array: the array's id and the task's index.
    array_id: str | None = None
    array_index: int | None = None

    @property
    def key(self) -> JobKey:
        return (self.job_id, self.attempt, self.replica)


@dataclass(frozen=True, slots=True)
class Stop:
    """Terminate the process and report it as `outcome` (SIGTERM, grace, SIGKILL)."""

    key: JobKey
    outcome: Outcome = "cancelled"
    reason: str = "cancelled by user"
    #: The job's checkpoint signal first, if it asked for one (`JobSpec.signal`): a
    #: preemption or a failed GPU; a user's cancel stops it at once.
    checkpoint: bool = False


@dataclass(frozen=True, slots=True)
class Drop:
    """Kill the process silently: nothing about it will be published."""

    key: JobKey


@dataclass(frozen=True, slots=True)
class Forget:
    """Let go of an exited process and of any report it still has pending."""

    key: JobKey


@dataclass(frozen=True, slots=True)
class Report:
    """Publish this event now."""

    decision: Decision


Action = Ensure | Stop | Drop | Forget | Report


def started(
    job: JobState,
    node: str,
    pid: int | None,
    replica: int = 0,
    master: tuple[str, int] | None = None,
) -> Decision:
    address, port = master if master is not None else (None, None)
    return Decision(
        JobStarted(
            job_id=job.job_id,
            attempt=job.attempt,
            node=node,
            pid=pid,
            replica=replica,
            master_addr=address,
            master_port=port,
        ),
        intents.started(job.job_id, job.attempt, replica),
        job.last_event_id,
    )


def finished(
    job: JobState,
    node: str,
    outcome: Outcome,
    exit_code: int | None,
    reason: str | None,
    replica: int = 0,
    ended_at: datetime | None = None,
) -> Decision:
    return Decision(
        JobFinished(
            job_id=job.job_id,
            attempt=job.attempt,
            node=node,
            outcome=outcome,
            exit_code=exit_code,
            reason=reason,
            replica=replica,
            ended_at=ended_at,
        ),
        intents.finished(job.job_id, job.attempt, replica),
        job.last_event_id,
    )


def hosted_replicas(job: JobState, node: str) -> list[int]:
    """Replicas of the job's current placement hosted on `node` (replica 0 for old events)."""
    if not job.replicas:
        return [0] if job.node == node else []
    return [r for r, replica in enumerate(job.replicas) if replica.host == node]


def is_current(state: ClusterState, key: JobKey, node: str) -> bool:
    """Whether the log has replica `key` placed or running on `node`, not yet finished."""
    job = state.jobs.get(key[0])
    return (
        job is not None
        and job.attempt == key[1]
        and job.phase in ON_NODE_PHASES
        and key[2] in hosted_replicas(job, node)
        and key[2] not in job.finished_replicas
    )


def run_started_at(job: JobState) -> datetime | None:
    """When the current attempt started, from its JobStarted; None if it has not."""
    if job.runs and job.runs[-1].attempt == job.attempt:
        return job.runs[-1].started_at
    return None


def _ensure(job: JobState, node: str, replica: int) -> Ensure:
    if job.replicas:
        slices = tuple(job.replicas[replica].slices)
        local = [s for s in slices if s.node == node]
        indexes, uuids = tuple(s.index for s in local), tuple(s.uuid for s in local)
    else:
        slices, indexes, uuids = (), job.gpu_indexes, job.gpu_uuids
    return Ensure(
        job_id=job.job_id,
        attempt=job.attempt,
        node=node,
        # a replica of a running gang that has not started yet is still to be started
        phase=job.phase if replica in job.started_replicas else "placed",
        spec=job.spec,
        gpu_indexes=indexes,
        gpu_uuids=uuids,
        started_at=run_started_at(job),
        slices=slices,
        replica=replica,
        hosts=tuple(r.host for r in job.replicas),
        master=job.master if replica else None,
        array_id=job.array_id,
        array_index=job.array_index,
    )


#: A gang replica's outcomes that end the rest of the gang (`gang_ended`).
GANG_ENDING = ("failed", "timed_out")


def gang_ended(job: JobState) -> str | None:
    """Why the other replicas of a gang end, or None: a replica failed or timed out
    (the first one reported). Its peers would otherwise wait for it for ever in their
    collectives: they are stopped and end `failed`, and so does the job."""
    if len(job.replicas) < 2:
        return None
    for replica, (outcome, exit_code, _) in job.finished_replicas.items():
        if outcome in GANG_ENDING and replica not in job.left:
            code = "" if exit_code is None else f" with exit code {exit_code}"
            return f"replica {replica} {outcome.replace('_', ' ')}{code}: the gang ends"
    return None


def _for_replica(job: JobState, node: str, replica: int, local: Local | None) -> list[Action]:
    not_started = replica not in job.started_replicas
    ended_by = gang_ended(job)
    if local is None:
        if not_started and job.cancel_requested:
            return [
                Report(finished(job, node, "cancelled", None, "cancelled before start", replica))
            ]
        if not_started and job.health_stop is not None:
            why = f"{job.health_stop} before start"
            return [Report(finished(job, node, "preempted", None, why, replica))]
        if not_started and job.preempted_by is not None:
            why = f"preempted by {job.preempted_by} before start"
            return [Report(finished(job, node, "preempted", None, why, replica))]
        if not_started and replica in job.leaving:
            why = f"left the elastic gang for {job.shrink_by} before start"
            return [Report(finished(job, node, "preempted", None, why, replica))]
        if not_started and ended_by is not None:
            return [Report(finished(job, node, "failed", None, ended_by, replica))]
        if not_started and replica > 0 and len(job.replicas) > 1 and job.master is None:
            return []  # it starts once replica 0's rendezvous is in the log
        return [_ensure(job, node, replica)]
    if local.status is Status.ORPHAN:
        return [_ensure(job, node, replica)]
    if local.status is Status.RUNNING:
        if job.cancel_requested:
            return [Stop((job.job_id, job.attempt, replica))]
        if job.health_stop is not None:  # a GPU of the job failed: requeued once stopped
            key = (job.job_id, job.attempt, replica)
            return [Stop(key, "preempted", job.health_stop, checkpoint=True)]
        if job.preempted_by is not None:
            why = f"preempted by {job.preempted_by}"
            return [Stop((job.job_id, job.attempt, replica), "preempted", why, checkpoint=True)]
        if replica in job.leaving:  # an elastic gang shrinks: this replica goes, the rest stays
            why = f"left the elastic gang for {job.shrink_by}"
            return [Stop((job.job_id, job.attempt, replica), "preempted", why, checkpoint=True)]
        if ended_by is not None:
            return [Stop((job.job_id, job.attempt, replica), "failed", ended_by)]
        if not_started:
            return [Report(started(job, node, local.pid, replica, local.master))]
    return []


def reconcile(
    state: ClusterState, nodes: Sequence[str], local: Mapping[JobKey, Local]
) -> list[Action]:
    """The actions that bring the local processes in line with the log (see module doc)."""
    actions: list[Action] = []
    for node in sorted(nodes):
        for job_id in sorted(state.on_node.get(node, ())):
            job = state.jobs[job_id]
            if job.phase not in ON_NODE_PHASES:
                continue
            for replica in hosted_replicas(job, node):
                if replica in job.finished_replicas:
                    continue
                key = (job_id, job.attempt, replica)
                actions.extend(_for_replica(job, node, replica, local.get(key)))
    for key in sorted(local):
        proc = local[key]
        if is_current(state, key, proc.node):
            continue
        if proc.status is Status.EXITED:
            actions.append(Forget(key))
        elif proc.status is not Status.DROPPING:
            actions.append(Drop(key))
    return actions

"""The fold's rules of an elastic gang (`JobSpec.min_replicas`, docs/distributed.md):
its running attempt grows (JobGrown) and shrinks (JobShrunk, then each leaving
replica's JobFinished), each replica holding, and charged for, its own interval."""

from __future__ import annotations

from gpuloom.events import REPLICA_NUMBERS_PER_REPLICA, JobFinished, JobGrown, JobShrunk
from gpuloom.state.errors import Invalid
from gpuloom.state.lifecycle import require_step
from gpuloom.state.model import ClusterState, JobState
from gpuloom.state.reservations import placement_refusal
from gpuloom.state.retention import known
from gpuloom.state.rules.assignment import (
    assignment_problem,
    held_milli,
    hold_replicas,
    milli_by_model,
    slice_memory,
)
from gpuloom.state.rules.common import Rule, job_of, rule, touch
from gpuloom.state.step import Step


def _elastic_running(job: JobState, attempt: int, what: str) -> None:
    """Invalid unless `job` is an elastic gang at `attempt` that is not being stopped."""
    if not job.spec.elastic:
        raise Invalid(f"job {job.job_id} is not elastic: it cannot be {what}")
    if attempt != job.attempt:
        raise Invalid(f"attempt {attempt} is not job {job.job_id}'s current {job.attempt}")
    if job.preempted_by is not None or job.health_stop is not None or job.cancel_requested:
        raise Invalid(f"job {job.job_id} is stopping: it cannot be {what}")


def _grown(state: ClusterState, event: JobGrown, step: Step) -> None:
    job = job_of(state, event.job_id)
    require_step(job, "JobGrown")
    _elastic_running(job, event.attempt, "grown")
    if job.leaving:
        raise Invalid(f"job {job.job_id} is shrinking: it grows once its replicas left")
    if event.first != len(job.replicas):
        raise Invalid(f"replica {event.first} is not job {job.job_id}'s next ({len(job.replicas)})")
    # a replica that ended holds its GPUs until the gang's run ends (as in a fixed gang)
    held = len(job.held_replicas()) + len(event.replicas)
    if held > job.spec.replicas:
        raise Invalid(f"{held} replicas, job {job.job_id} may have {job.spec.replicas}")
    numbered = len(job.replicas) + len(event.replicas)
    if numbered > REPLICA_NUMBERS_PER_REPLICA * job.spec.replicas:
        raise Invalid(f"attempt {job.attempt} of job {job.job_id} numbered its replicas out")
    joining = [replica for _, replica in job.held_replicas()]
    problem = assignment_problem(state, job.spec, event.replicas, joining)
    if problem is None and (state.reservations or job.spec.reservation is not None):
        problem = placement_refusal(state, job, event.replicas, step.envelope.at)
    if problem is not None:
        raise Invalid(problem)
    hold_replicas(state, job, event.replicas, step)
    job.replicas = (*job.replicas, *event.replicas)
    for name in job.nodes_held():
        state.on_node.setdefault(name, set()).add(job.job_id)
    _rerate(state, job, step)
    touch(state, job, step)


def _shrunk(state: ClusterState, event: JobShrunk, step: Step) -> None:
    job = job_of(state, event.job_id)
    require_step(job, "JobShrunk")
    _elastic_running(job, event.attempt, "shrunk")
    if job.shrink_by is not None:
        raise Invalid(f"job {job.job_id} is already shrinking for {job.shrink_by}")
    if not known(state, event.by):
        raise Invalid(f"preempting job {event.by} does not exist")
    live = job.live_replicas()
    leaving = set(event.replicas)
    if len(leaving) != len(event.replicas) or not leaving <= set(live):
        raise Invalid(f"replicas {event.replicas} are not running replicas of job {job.job_id}")
    if len(live) - len(leaving) < job.spec.least_replicas:
        raise Invalid(
            f"job {job.job_id} would keep {len(live) - len(leaving)} replicas, under its"
            f" minimum of {job.spec.least_replicas}"
        )
    job.leaving = leaving
    job.shrink_by = event.by
    job.reason = f"Shrinking for {event.by} ({event.reason}): replicas {sorted(leaving)} stop"
    touch(state, job, step)


def replica_left(state: ClusterState, job: JobState, event: JobFinished, step: Step) -> None:
    """A replica told to leave by a JobShrunk ended: it lets go of what it held, and its
    charge ends here. The job's outcome is the other replicas' (it is in `left`)."""
    number = event.replica
    job.leaving.discard(number)
    job.left.add(number)
    job.finished_replicas[number] = (event.outcome, event.exit_code, event.reason)
    release_replica(state, job, number, step)
    _rerate(state, job, step)
    if not job.leaving:
        job.shrink_by = None
        job.reason = None


def release_replica(state: ClusterState, job: JobState, number: int, step: Step) -> None:
    """Give back what replica `number` held (it is already in `job.left`); a node the job
    holds nothing on any more no longer lists it."""
    replica = job.replicas[number]
    job_id = job.job_id
    host = state.nodes.get(replica.host)
    if host is not None and job_id in host.hosted:
        step.changed_node(host.name)
        cpu, memory = host.hosted[job_id]
        host.hosted[job_id] = (cpu - replica.cpu_milli, memory - replica.memory_mib)
    for piece in replica.slices:
        node = state.nodes.get(piece.node)
        gpu = node.gpus.get(piece.index) if node is not None else None
        if gpu is None or job_id not in gpu.holders:
            continue
        step.changed_node(piece.node)
        milli, memory = gpu.holders[job_id]
        milli, memory = milli - piece.milli, memory - slice_memory(gpu, piece)
        if milli <= 0:
            del gpu.holders[job_id]
        else:
            gpu.holders[job_id] = (milli, memory)
    still = job.nodes_held()
    for name in {replica.host, *(piece.node for piece in replica.slices)} - still:
        node = state.nodes.get(name)
        if node is not None:
            node.hosted.pop(job_id, None)
        state.on_node.get(name, set()).discard(job_id)


def _rerate(state: ClusterState, job: JobState, step: Step) -> None:
    """The run holds what its replicas hold now, from this event on (from the fault, once
    a GPU of the job failed: its charge ends there, `_finished`)."""
    run = job.current_run()
    if run is not None:
        at = step.envelope.at
        if job.health_at is not None:
            at = min(at, job.health_at)
        gpus = job.spec.gpus * len(job.held_replicas())
        run.rerate(at, held_milli(job), milli_by_model(state, job), gpus)


RULES: tuple[Rule, ...] = (
    rule(JobGrown, _grown),
    rule(JobShrunk, _shrunk),
)

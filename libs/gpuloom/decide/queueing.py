"""Queue: give admitted jobs their priority, cancel pending jobs, and define queue order."""

from __future__ import annotations

from typing import Literal

from gpuloom.decide import Decision
from gpuloom.events import JobCancelled, JobQueued
from gpuloom.state import ClusterState, JobState

DependencyStatus = Literal["met", "waiting", "never"]


def dependency_status(state: ClusterState, job: JobState) -> tuple[DependencyStatus, str | None]:
    """Whether the jobs `job` depends on have ended as it needs, with a reason if not.

    `never`: a dependency is unknown, or ended otherwise than `succeeded` when the
    job needs it to succeed. `waiting`: a dependency has not ended yet.
    """
    waiting: list[str] = []
    for dependency in job.spec.depends_on:
        other = state.jobs.get(dependency.job)
        if other is None:
            return "never", f"depends on unknown job {dependency.job}"
        if not other.is_final:
            waiting.append(
                f"{dependency.job} to {'succeed' if dependency.when == 'succeeded' else 'end'}"
            )
            continue
        if dependency.when == "succeeded" and other.phase != "succeeded":
            return "never", f"dependency {dependency.job} ended {other.phase}, not succeeded"
    if waiting:
        return "waiting", "Dependency: waiting for " + ", ".join(waiting)
    return "met", None


def queue_key(job: JobState) -> tuple[int, int, str]:
    """Total order of pending jobs: higher priority first, then submission order, then id."""
    return (-job.priority, job.submit_seq, job.job_id)


def queue_order(state: ClusterState) -> list[JobState]:
    """Queued jobs that placement may place (dependencies met), in queue order."""
    jobs = [state.jobs[j] for j in state.queued]
    return sorted(
        (
            job
            for job in jobs
            if not job.cancel_requested
            and (not job.spec.depends_on or dependency_status(state, job)[0] == "met")
        ),
        key=queue_key,
    )


def decide_queue(state: ClusterState) -> list[Decision]:
    decisions: list[Decision] = []
    for job_id in sorted(state.cancel_pending, key=lambda j: state.jobs[j].submit_seq):
        job = state.jobs[job_id]
        if job.phase in ("submitted", "admitted", "queued"):
            decisions.append(
                Decision(JobCancelled(job_id=job_id), f"{job_id}:cancelled", job.last_event_id)
            )
    for job_id in sorted(state.queued, key=lambda j: state.jobs[j].submit_seq):
        job = state.jobs[job_id]
        if not job.spec.depends_on or job.cancel_requested:
            continue
        status, why = dependency_status(state, job)
        if status == "never":
            decisions.append(
                Decision(
                    JobCancelled(job_id=job_id, reason=f"DependencyNeverSatisfied: {why}"),
                    f"{job_id}:cancelled",
                    job.last_event_id,
                )
            )
    for job_id in sorted(state.admitted, key=lambda j: state.jobs[j].submit_seq):
        job = state.jobs[job_id]
        if job.cancel_requested:
            continue
        decisions.append(
            Decision(
                JobQueued(job_id=job_id, priority=job.spec.priority),
                f"{job_id}:queued",
                job.last_event_id,
            )
        )
    return decisions

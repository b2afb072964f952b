"""Queue: give admitted jobs their priority, cancel pending jobs, and define queue order."""

from __future__ import annotations

from gpuloom.decide import Decision
from gpuloom.events import JobCancelled, JobQueued
from gpuloom.state import ClusterState, JobState


def queue_key(job: JobState) -> tuple[int, int, str]:
    """Total order of pending jobs: higher priority first, then submission order, then id."""
    return (-job.priority, job.submit_seq, job.job_id)


def queue_order(state: ClusterState) -> list[JobState]:
    """Queued jobs that placement may place, in queue order."""
    jobs = [state.jobs[j] for j in state.queued]
    return sorted((job for job in jobs if not job.cancel_requested), key=queue_key)


def decide_queue(state: ClusterState) -> list[Decision]:
    decisions: list[Decision] = []
    for job_id in sorted(state.cancel_pending, key=lambda j: state.jobs[j].submit_seq):
        job = state.jobs[job_id]
        if job.phase in ("submitted", "admitted", "queued"):
            decisions.append(
                Decision(JobCancelled(job_id=job_id), f"{job_id}:cancelled", job.last_event_id)
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

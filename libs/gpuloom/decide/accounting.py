"""Accounting: charge every ended run of a job exactly once, in GPU-milli-seconds."""

from __future__ import annotations

from gpuloom.decide import Decision
from gpuloom.events import UsageCharged
from gpuloom.state import ClusterState


def decide_charges(state: ClusterState) -> list[Decision]:
    decisions: list[Decision] = []
    for job_id in sorted(state.uncharged, key=lambda j: state.jobs[j].submit_seq):
        job = state.jobs[job_id]
        for run in job.runs:
            if run.ended_at is None or run.attempt in job.charged_attempts:
                continue
            seconds = run.seconds
            event = UsageCharged(
                job_id=job_id,
                attempt=run.attempt,
                user=job.spec.user,
                account=job.spec.account,
                gpus=run.gpus,
                seconds=seconds,
                gpu_milli_seconds=run.gpu_milli_seconds(),
                by_model={m: round(milli * seconds) for m, milli in run.milli_by_model.items()},
            )
            decisions.append(Decision(event, f"{job_id}:charged:{run.attempt}", job.last_event_id))
    return decisions

"""Accounting: charge every run of a job, periodically while it runs and in full once it ended.

The charges of one run add up exactly to its GPU time (milli-GPU x seconds, from
the log's timestamps): an interim charge covers the time since the previous one
up to `now` (the shell's clock, recorded in the event, so replay needs no
clock), and the final charge is the whole run's amount less what was charged.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpuloom.events import Decision, UsageCharged, intents
from gpuloom.state import ClusterState, JobState, Run


def _charge(job: JobState, run: Run, end: datetime, final: bool) -> UsageCharged:
    since = run.charged_until or run.started_at
    total = run.gpu_milli_seconds() if final else run.accrued(end)
    by_model = {
        model: max(0, amount - run.charged_by_model.get(model, 0))
        for model, amount in run.accrued_by_model(end).items()
    }
    return UsageCharged(
        job_id=job.job_id,
        attempt=run.attempt,
        user=job.spec.user,
        account=job.spec.account,
        gpus=run.gpus,
        seconds=max(0.0, (end - since).total_seconds()),
        gpu_milli_seconds=max(0, total - run.charged_milli_seconds),
        by_model=by_model,
        part=run.charges,
        period_end=None if final else end,
    )


def decide_charges(
    state: ClusterState, now: datetime | None = None, interval: timedelta | None = None
) -> list[Decision]:
    """Final charges of ended runs; with `now` and `interval`, interim charges of runs
    that have gone `interval` or longer without one."""
    decisions: list[Decision] = []
    for job_id in sorted(state.uncharged, key=lambda j: state.jobs[j].order):
        job = state.jobs[job_id]
        for run in job.runs:
            if run.ended_at is None or run.attempt in job.charged_attempts:
                continue
            event = _charge(job, run, run.ended_at, final=True)
            msg_id = intents.charged(job_id, run.attempt, run.charges, interim=False)
            decisions.append(Decision(event, msg_id, job.last_event_id))
    if now is None or interval is None:
        return decisions
    on_node = sorted({j for jobs in state.on_node.values() for j in jobs})
    for job_id in sorted(on_node, key=lambda j: state.jobs[j].order):
        job = state.jobs[job_id]
        current = job.current_run()
        if current is None or now - (current.charged_until or current.started_at) < interval:
            continue
        event = _charge(job, current, now, final=False)
        msg_id = intents.charged(job_id, current.attempt, current.charges, interim=True)
        decisions.append(Decision(event, msg_id, job.last_event_id))
    return decisions

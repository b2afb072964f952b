"""`gpuloom submit --wait`: follow a job to its end and say each new state on stderr."""

from __future__ import annotations

import time

from gpuloom.client import render
from gpuloom.client.api import GpuloomClient
from gpuloom.client.context import err
from gpuloom.client.errors import ApiError
from gpuloom.client.schema import FINAL_STATES, Job
from gpuloom.client.watch import follow

#: How many 404s `submit --wait` accepts before the new job shows in the read model.
NOT_YET_VISIBLE_POLLS = 30


#: Events after which a job may be final (a preempted run's JobFinished is not).
ENDINGS = ("JobFinished", "JobCancelled", "JobRejected")


def wait_for_final(client: GpuloomClient, job_id: str, poll_interval_s: float) -> Job:
    """Follow the job's events (`GET /v1/events`) until it reaches a final state, and
    report each new state on stderr; poll instead where the gateway has no stream."""
    seen = [""]
    try:
        for event in follow(client, after=0, job=job_id):
            job = _report(client, job_id, seen)
            if job is not None and job["state"] in FINAL_STATES:
                return job
            if event["type"].split(".")[3] in ENDINGS:  # the row may trail the log a little
                job = _poll(client, job_id, poll_interval_s, seen, polls=NOT_YET_VISIBLE_POLLS)
                if job is not None:
                    return job
    except ApiError as exc:
        if exc.status not in (404, 410):  # no stream here, or the log was trimmed
            raise
    job = _poll(client, job_id, poll_interval_s, seen, polls=None)
    assert job is not None
    return job


def _report(client: GpuloomClient, job_id: str, seen: list[str]) -> Job | None:
    """The job's row, its state said on stderr when it changed; None: not visible yet."""
    try:
        job = client.get_job(job_id)
    except ApiError as exc:
        if exc.status != 404:
            raise
        return None
    if job["state"] != seen[0]:
        seen[0] = job["state"]
        err.print(f"{job_id}: {render.state_text(seen[0])}")
    return job


def _poll(
    client: GpuloomClient, job_id: str, poll_interval_s: float, seen: list[str], polls: int | None
) -> Job | None:
    """Poll until the job is final (`polls` times at most; None: for ever, tolerating
    a few 404s while the read model catches up with the submission)."""
    misses = tried = 0
    while polls is None or tried < polls:
        tried += 1
        job = _report(client, job_id, seen)
        if job is None:
            misses += 1
            if misses > NOT_YET_VISIBLE_POLLS:
                raise ApiError(404, f"job {job_id} not found")
        elif job["state"] in FINAL_STATES:
            return job
        time.sleep(poll_interval_s)
    return None

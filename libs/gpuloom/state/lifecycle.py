"""A job's lifecycle, in one table: for each event that moves a job, the phases it may
find the job in, and the phases it may leave it in.

The fold's rules check an event against `LIFECYCLE` (`require_step`) before anything
else about it: an event the table does not allow where the job stands is voided with the
reason. What else a rule checks (the attempt, the replica, a GPU held) is its own; the
phase it moves the job to is one of the table's, which the tests of random logs hold
every applied event to. docs/architecture.md ("What the state keeps") shows the table.

    submitted -> admitted -> queued -> placed -> running -> succeeded | failed | timed_out
        \\-> rejected     \\________\\_____\\________\\-> cancelled
                                   ^------ preempted: requeued ------/
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuloom.state.errors import Invalid
from gpuloom.state.model import JobPhase, JobState

PENDING: tuple[JobPhase, ...] = ("submitted", "admitted", "queued")
ON_NODE: tuple[JobPhase, ...] = ("placed", "running")
ENDED: tuple[JobPhase, ...] = ("rejected", "succeeded", "failed", "cancelled", "timed_out")


@dataclass(frozen=True, slots=True)
class Step:
    """What one event type may do to a job: the phases it may find it in (`source`;
    empty for the event that makes the job), and those it may leave it in (`target`;
    empty: the phase stays)."""

    source: tuple[JobPhase, ...]
    target: tuple[JobPhase, ...] = ()


#: Event type -> its step. An event type that is not here changes no job's phase (the
#: tests of random logs check every applied event against this table).
LIFECYCLE: dict[str, Step] = {
    "JobSubmitted": Step((), ("submitted",)),
    "JobArraySubmitted": Step((), ("submitted",)),
    "JobAdmitted": Step(("submitted",), ("admitted",)),
    "JobRejected": Step(("submitted",), ("rejected",)),
    "JobQueued": Step(("admitted",), ("queued",)),
    # a cancel request of a job that has not ended: the queue or the agent carries it out
    "JobCancelRequested": Step((*PENDING, *ON_NODE)),
    "JobCancelled": Step((*PENDING, "placed"), ("cancelled",)),
    "JobPlaced": Step(("queued",), ("placed",)),
    "JobReserved": Step(("queued",)),
    "JobPreempted": Step(ON_NODE),
    # an elastic gang grows once it runs (its rendezvous is known), and shrinks on a node
    "JobGrown": Step(("running",)),
    "JobShrunk": Step(ON_NODE),
    # the first replica to start makes the job running; the others find it so
    "JobStarted": Step(ON_NODE, ("running",)),
    # a replica's end: the last one ends the job (requeued when it was preempted), the
    # others leave it where it is
    "JobFinished": Step(ON_NODE, (*ON_NODE, "queued", *ENDED[1:])),
    # a node lost: each job on it is requeued, or cancelled when a cancel waited
    "NodeLost": Step(ON_NODE, ("queued", "cancelled")),
    # charges come while a run goes on and after it ended (the final one), the job
    # maybe requeued since
    "UsageCharged": Step(("queued", *ON_NODE, *ENDED)),
}


def require_step(job: JobState, event_type: str) -> None:
    """Raise `Invalid` when `LIFECYCLE` does not let `event_type` find `job` where it is."""
    source = LIFECYCLE[event_type].source
    if job.phase not in source:
        raise Invalid(f"job {job.job_id} is {job.phase}, not {'/'.join(source)}")

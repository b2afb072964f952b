"""Events written by the queue service."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field

from gpuloom.events.base import Event, JobEvent


class JobQueued(JobEvent):
    """The job waits for placement with this effective priority (higher first); with
    an array's id, every task of the array admitted and not yet queued, by index."""

    TYPE: ClassVar[str] = "JobQueued"
    priority: int


class JobCancelled(JobEvent):
    """A cancel request was carried out before the job started on a node.

    Jobs that already run are cancelled by their node agent, which reports
    `JobFinished` with outcome `cancelled` once the process is gone.
    """

    TYPE: ClassVar[str] = "JobCancelled"
    reason: str = "cancelled by user"


class QueuePolicySet(Event):
    """The queue's priority weights, fair-share half-life, backfill and preemption, as configured.

    Written by the queue service when its configuration differs from the log's,
    so that every service orders the queue alike and audits replay it.
    """

    TYPE: ClassVar[str] = "QueuePolicySet"
    AGGREGATE: ClassVar[str] = "queue"
    weight_age: int = Field(default=0, ge=0)
    weight_fair_share: int = Field(default=0, ge=0)
    weight_size: int = Field(default=0, ge=0)
    max_age_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    fair_share_half_life_s: float = Field(default=7 * 24 * 3600.0, gt=0)
    #: "easy": lower jobs may start around the top blocked job's reservation (EASY
    #: backfill); "off": strict order, nothing passes a job that cannot start.
    backfill: Literal["easy", "off"] = "easy"
    #: Whether blocked jobs may preempt (lower preemptible classes, quota reclaim).
    preemption: bool = True
    #: A job preempted and requeued ranks right behind the job it was stopped for,
    #: while that job waits: else, ranked before it (fair share, age, an earlier
    #: submission), it is placed again on what it was stopped to free, and preempted
    #: again, until its usage ranks it lower (`JobState.yields_to`). False in logs
    #: written before it: their decisions are re-made as they were made.
    victims_yield: bool = False
    #: How many queued jobs behind the first that cannot start a placement pass tries
    #: (Slurm's `bf_max_job_test`): a pass over a deep backlog then costs a bounded
    #: time. None: every one (logs written before it: their decisions are re-made as
    #: they were made).
    backfill_depth: int | None = Field(default=None, ge=1, le=1_000_000)
    #: Among jobs of equal priority, each user's jobs take turns with everyone
    #: else's (start-time fair queuing, `JobState.queue_tag`): a user's burst of
    #: thousands puts another user's job behind about one of its jobs, not all of
    #: them; without a backlog the order is still submission order. False: first in,
    #: first out, as in logs written before it (their decisions are re-made so).
    fair_queuing: bool = False
    #: The most of one user's jobs placed and not started yet, per schedulable node
    #: (the user's limit is this times their number; `QuotaBook.unstarted_cap`). An
    #: agent starts one user's jobs at a paced rate (`services.agent.pacing`): jobs
    #: placed beyond what it starts soon hold GPUs idle that other users could run
    #: on, so a burst of one user's tasks would keep everyone else waiting for a GPU.
    #: Past it a job waits with reason `StartPacing`. None: no limit (logs written
    #: before it: their decisions are re-made as they were made).
    unstarted_per_node: int | None = Field(default=None, ge=1, le=1_000_000)

    def aggregate_id(self) -> str:
        return "policy"

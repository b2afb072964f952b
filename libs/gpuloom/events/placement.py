"""Events written by the placement service."""

from __future__ import annotations

from datetime import datetime
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpuloom.events.base import JobEvent
from gpuloom.events.units import MILLI_PER_GPU


class PolicyRef(BaseModel):
    """Which policy made a decision, at which version, with which parameters."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    version: int
    params: dict[str, Any] = Field(default_factory=dict)


class SliceRef(BaseModel):
    """`milli` milli-GPU and `memory_mib` of GPU `index` (`uuid`) of `node`."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    index: int = Field(ge=0)
    uuid: str
    milli: int = Field(ge=1, le=MILLI_PER_GPU)
    memory_mib: int = Field(ge=0)


class ReplicaAssignment(BaseModel):
    """Where one replica runs (`host`) and what it holds there and on lenders."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    slices: list[SliceRef] = Field(default_factory=list)
    cpu_milli: int = Field(default=0, ge=0)
    memory_mib: int = Field(default=0, ge=0)


class JobPlaced(JobEvent):
    """Placement assigned GPUs (whole or sliced) to every replica of one attempt of a job.

    `basis_seq` is the stream sequence the placement state was folded to when the
    decision was made and `cycle_position` the job's rank among the decisions of
    that cycle: folding the log to `basis_seq` and re-running `policy` must give
    the same assignment.
    """

    TYPE: ClassVar[str] = "JobPlaced"
    attempt: int = Field(ge=1)
    #: Replica 0's host and its local GPUs (what a single-replica job needs to know).
    node: str
    gpu_indexes: list[int]
    gpu_uuids: list[str]
    #: Every replica with its slices; empty in events written before pools existed,
    #: which meant one replica holding `gpu_indexes` of `node` whole.
    replicas: list[ReplicaAssignment] = Field(default_factory=list)
    basis_seq: int = Field(ge=0)
    cycle_position: int = Field(ge=0)
    policy: PolicyRef
    #: Started while a job ahead of it could not (backfill around its reservation).
    backfilled: bool = False

    def assignments(self) -> list[ReplicaAssignment]:
        """The replicas, reading an old-style event as one replica of whole GPUs."""
        if self.replicas:
            return list(self.replicas)
        return [
            ReplicaAssignment(
                host=self.node,
                slices=[
                    SliceRef(node=self.node, index=i, uuid=u, milli=MILLI_PER_GPU, memory_mib=0)
                    for i, u in zip(self.gpu_indexes, self.gpu_uuids, strict=False)
                ],
            )
        ]


class JobReserved(JobEvent):
    """The blocked job at the head of the queue is to start at `start_at` on `replicas`.

    EASY backfill: later jobs start now only if they end before `start_at` or
    leave these resources alone. `start_at` None: the start waits on jobs without
    a time limit. Recorded by the placement cycle that found it (same basis,
    position and policy fields as JobPlaced), so `gpuloom audit` re-makes it too.
    """

    TYPE: ClassVar[str] = "JobReserved"
    start_at: datetime | None
    replicas: list[ReplicaAssignment]
    basis_seq: int = Field(ge=0)
    cycle_position: int = Field(ge=0)
    policy: PolicyRef


#: The most replicas one attempt of an elastic gang may number, per replica it may
#: have (`JobSpec.replicas`): a replica that left is never numbered again in the attempt
#: (its events keep their ids), so growth stops at this many until the job is requeued.
REPLICA_NUMBERS_PER_REPLICA = 8


class JobGrown(JobEvent):
    """An elastic gang's running attempt grows: `replicas` join it, numbered `first`,
    `first + 1`, ... (after every replica it has numbered in this attempt).

    Written by the placement cycle that found the room (same basis, position and policy
    fields as JobPlaced, so `gpuloom audit` re-makes it); the agents of their hosts start
    them, and the gang's rendezvous takes them in (docs/distributed.md).
    """

    TYPE: ClassVar[str] = "JobGrown"
    attempt: int = Field(ge=1)
    first: int = Field(ge=1)
    replicas: list[ReplicaAssignment] = Field(min_length=1, max_length=1024)
    basis_seq: int = Field(ge=0)
    cycle_position: int = Field(ge=0)
    policy: PolicyRef


class JobShrunk(JobEvent):
    """Replicas `replicas` of an elastic gang's attempt `attempt` are to stop so that job
    `by` can start: the gang shrinks (never below its minimum) instead of being
    preempted whole. Their agents stop them as for a preemption and report them
    `preempted`; the rest of the gang runs on, and its rendezvous lets them go."""

    TYPE: ClassVar[str] = "JobShrunk"
    attempt: int = Field(ge=1)
    replicas: list[int] = Field(min_length=1, max_length=1024)
    by: str
    reason: Literal["priority", "reclaim"]
    basis_seq: int = Field(ge=0)
    cycle_position: int = Field(ge=0)
    policy: PolicyRef


class JobPreempted(JobEvent):
    """Attempt `attempt` of this job is to stop so that job `by` can start.

    `reason`: `priority` (a higher priority class preempts a preemptible job) or
    `reclaim` (an account takes back its nominal quota from a borrower). The
    node agent stops the job (SIGTERM, grace, SIGKILL) and reports it
    `preempted`; the job is then requeued with its place and its usage kept.
    """

    TYPE: ClassVar[str] = "JobPreempted"
    attempt: int = Field(ge=1)
    by: str
    reason: Literal["priority", "reclaim"]
    basis_seq: int = Field(ge=0)
    cycle_position: int = Field(ge=0)
    policy: PolicyRef

"""The folded state of the cluster: nodes, GPUs, jobs, allocations, usage.

Plain mutable dataclasses, changed only by `gpuloom.state.fold.apply`. Every
collection a decision iterates is sorted explicitly by the decision (node name,
GPU index, job order): nothing depends on dict or set iteration order.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from gpuloom.events.audit import AuditCompleted
from gpuloom.events.gateway import array_task_id
from gpuloom.events.inventory import NodeSpec
from gpuloom.events.jobs import JobSpec
from gpuloom.events.placement import JobReserved, ReplicaAssignment
from gpuloom.events.queue import QueuePolicySet
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.state.tenancy import (
    AccountState,
    AdvanceReservation,
    IdentityLimits,
    PriorityClass,
    Webhook,
)
from gpuloom.state.usage import DecayedUsage

JobPhase = Literal[
    "submitted",
    "admitted",
    "rejected",
    "queued",
    "placed",
    "running",
    "succeeded",
    "failed",
    "cancelled",
    "timed_out",
]
NodePhase = Literal["ready", "lost"]

FINAL_PHASES: frozenset[str] = frozenset(
    {"rejected", "succeeded", "failed", "cancelled", "timed_out"}
)
ON_NODE_PHASES: frozenset[str] = frozenset({"placed", "running"})
PENDING_PHASES: frozenset[str] = frozenset({"submitted", "admitted", "queued"})


@dataclass
class GpuState:
    """One GPU: its pool and who holds what of it (job id -> (milli-GPU, memory MiB))."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    pool: str = "physical"
    holders: dict[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def milli_used(self) -> int:
        return sum(milli for milli, _ in self.holders.values())

    @property
    def memory_used(self) -> int:
        return sum(memory for _, memory in self.holders.values())

    @property
    def idle(self) -> bool:
        return not self.holders

    def slice_memory(self, milli: int, memory_mib: int) -> int:
        """Memory a slice holds: a whole GPU holds all its memory, whatever an old event said."""
        return self.memory_mib if milli >= MILLI_PER_GPU else memory_mib

    @property
    def job_id(self) -> str | None:
        """A holder of the GPU (the only one for a whole GPU), None when idle."""
        return min(self.holders) if self.holders else None


@dataclass(frozen=True)
class GpuFault:
    """Why a GPU is out of service (GpuUnhealthy), until an operator resumes it."""

    uuid: str
    check: str
    evidence: str
    at: datetime

    @property
    def text(self) -> str:
        return f"{self.check}: {self.evidence}" if self.evidence else self.check


@dataclass
class NodeState:
    name: str
    phase: NodePhase
    spec: NodeSpec
    gpus: dict[int, GpuState]
    registered_at: datetime
    lost_at: datetime | None = None
    #: Pools set by an admin (GpuPoolChanged), by GPU index; they outlive re-registration.
    pool_overrides: dict[int, str] = field(default_factory=dict)
    #: CPU and memory held by replicas hosted here (job id -> (cpu milli, memory MiB)).
    hosted: dict[str, tuple[int, int]] = field(default_factory=dict)
    #: Cordoned by an admin (NodeCordoned): out of placement, with the reason given.
    cordoned: bool = False
    cordon_reason: str = ""
    #: GPUs out of service by index (GpuUnhealthy until GpuHealthy): placement leaves them.
    unhealthy: dict[int, GpuFault] = field(default_factory=dict)

    @property
    def schedulable(self) -> bool:
        """Placement may use the node: ready and not cordoned."""
        return self.phase == "ready" and not self.cordoned

    def free_gpu_indexes(self) -> list[int]:
        return sorted(i for i, gpu in self.gpus.items() if gpu.idle)

    @property
    def cpu_used(self) -> int:
        return sum(cpu for cpu, _ in self.hosted.values())

    @property
    def memory_used(self) -> int:
        return sum(memory for _, memory in self.hosted.values())

    def gpu_models(self) -> list[str]:
        return sorted({gpu.model for gpu in self.gpus.values()})


@dataclass
class Run:
    """One attempt of a job that really started on a node."""

    attempt: int
    node: str
    gpus: int
    started_at: datetime
    ended_at: datetime | None = None
    #: Milli-GPU held by all replicas of the attempt (1000 per whole GPU): what is charged.
    gpu_milli: int = 0
    #: The same, by GPU model.
    milli_by_model: dict[str, int] = field(default_factory=dict)

    #: An elastic gang's run changes what it holds as it grows and shrinks: what it held
    #: before `rate_since` (None: the start) is banked here, each replica charged for
    #: its own interval; `gpu_milli` and `milli_by_model` are what it holds since.
    rate_since: datetime | None = None
    banked_milli_seconds: int = 0
    banked_by_model: dict[str, int] = field(default_factory=dict)

    #: Charges of this run so far (interim ones while it runs, then the final one).
    charges: int = 0
    #: End of the latest interim charge; the next charge starts there.
    charged_until: datetime | None = None
    charged_milli_seconds: int = 0
    charged_by_model: dict[str, int] = field(default_factory=dict)

    @property
    def seconds(self) -> float:
        """Wall time of the run (0 while it runs), from the log's timestamps."""
        if self.ended_at is None:
            return 0.0
        return max(0.0, (self.ended_at - self.started_at).total_seconds())

    def milli_seconds_until(self, moment: datetime, milli: int) -> int:
        """Charge of `milli` milli-GPU from the rate's start to `moment` (exact integer
        rounding), what was banked before it not included."""
        since = self.rate_since or self.started_at
        return round(milli * max(0.0, (moment - since).total_seconds()))

    def accrued(self, moment: datetime) -> int:
        """The run's whole charge up to `moment`: what was banked, and what it holds now
        from the rate's start."""
        milli = self.gpu_milli or self.gpus * MILLI_PER_GPU
        return self.banked_milli_seconds + self.milli_seconds_until(moment, milli)

    def accrued_by_model(self, moment: datetime) -> dict[str, int]:
        """`accrued`, by GPU model."""
        models = sorted({*self.banked_by_model, *self.milli_by_model})
        return {
            model: self.banked_by_model.get(model, 0)
            + self.milli_seconds_until(moment, self.milli_by_model.get(model, 0))
            for model in models
        }

    def rerate(self, at: datetime, milli: int, by_model: dict[str, int], gpus: int) -> None:
        """From `at` on, the run holds `milli` (`by_model`, `gpus` GPUs): bank what it
        held until then (an elastic gang grew or a replica left). Never before the
        rate's start nor an interim charge already billed: charges are not taken back,
        and a run's charges add up to what it accrued."""
        at = max(at, self.rate_since or self.started_at, self.charged_until or self.started_at)
        for model, amount in self.accrued_by_model(at).items():
            self.banked_by_model[model] = amount
        self.banked_milli_seconds = self.accrued(at)
        self.rate_since = at
        self.gpu_milli, self.milli_by_model, self.gpus = milli, by_model, gpus

    def gpu_milli_seconds(self) -> int:
        """The exact integer charge of the ended run: a 0.25 GPU for an hour is 0.25 GPU-hours."""
        if self.ended_at is None:
            return 0
        return self.accrued(self.ended_at)


@dataclass
class JobState:
    job_id: str
    spec: JobSpec
    phase: JobPhase
    submitted_at: datetime
    submit_seq: int
    idempotency_key: str | None = None
    reason: str | None = None
    priority: int = 0
    array_id: str | None = None
    array_index: int | None = None
    #: Number of placements so far; the current placement is `attempt`.
    attempt: int = 0
    node: str | None = None
    gpu_indexes: tuple[int, ...] = ()
    gpu_uuids: tuple[str, ...] = ()
    #: Every replica of the current placement (slices on hosts and lenders).
    replicas: tuple[ReplicaAssignment, ...] = ()
    started_replicas: set[int] = field(default_factory=set)
    #: Replica -> (outcome, exit code, reason) of the current attempt.
    finished_replicas: dict[int, tuple[str, int | None, str | None]] = field(default_factory=dict)
    #: A gang's rendezvous (replica 0's address and port) in the current attempt, from
    #: replica 0's JobStarted: the other replicas start once it is known.
    master: tuple[str, int] | None = None
    exit_code: int | None = None
    started_at: datetime | None = None
    finished_at: datetime | None = None
    cancel_requested: bool = False
    #: When and at which sequence the current attempt was placed (backfill's clock).
    placed_at: datetime | None = None
    placed_seq: int = 0
    #: The job a JobPreempted stops the current attempt for, and when it was told.
    preempted_by: str | None = None
    preempted_at: datetime | None = None
    #: Its place among queued jobs of equal priority under fair queuing (a tag given
    #: when it is queued: `rules.jobs.fair_tag`); kept when it is requeued.
    queue_tag: int = 0
    #: Requeued after it was preempted: the job it was stopped for, until it is placed
    #: again (it ranks behind that job: `QueuePolicySet.victims_yield`).
    yields_to: str | None = None
    #: A GPU of the current attempt failed (GpuUnhealthy): why, and when (its charge
    #: ends there). The agents stop its replicas; then it is requeued, expedited.
    health_stop: str | None = None
    health_at: datetime | None = None
    #: An elastic gang's replicas told to stop by a JobShrunk and not ended yet, the job
    #: they stop for (None once they all ended), and the replicas that ended so: they
    #: hold nothing, and the job's outcome is that of the others.
    leaving: set[int] = field(default_factory=set)
    shrink_by: str | None = None
    left: set[int] = field(default_factory=set)
    #: Times it was requeued after a GPU failed under it.
    requeues: int = 0
    #: Requeued after a GPU failed, and not placed since: it goes first among the jobs
    #: of its priority (expedited requeue).
    expedited: bool = False
    runs: list[Run] = field(default_factory=list)
    charged_attempts: list[int] = field(default_factory=list)
    #: Envelope id of the latest event applied to this job (causation of the next).
    last_event_id: str | None = None
    last_seq: int = 0

    @property
    def is_final(self) -> bool:
        return self.phase in FINAL_PHASES

    def nodes_held(self) -> set[str]:
        """Every node the current placement holds something on (hosts and lenders)."""
        held: set[str] = set()
        for _, replica in self.held_replicas():
            held.add(replica.host)
            held.update(piece.node for piece in replica.slices)
        return held

    def held_replicas(self) -> list[tuple[int, ReplicaAssignment]]:
        """The current placement's replicas with their numbers, but those an elastic
        gang's shrink has ended (they hold nothing)."""
        left = self.left
        return [(n, r) for n, r in enumerate(self.replicas) if not left or n not in left]

    def live_replicas(self) -> list[int]:
        """The replicas of the attempt that have not ended (nor been told to leave)."""
        ended, leaving = self.finished_replicas, self.leaving
        return [n for n in range(len(self.replicas)) if n not in ended and n not in leaving]

    @property
    def order(self) -> tuple[int, int, str]:
        """Submission order, total: the tasks of one JobArraySubmitted share its
        sequence and go by index, and the job id breaks any other tie."""
        return (self.submit_seq, self.array_index or 0, self.job_id)

    def current_run(self) -> Run | None:
        if self.runs and self.runs[-1].attempt == self.attempt and self.runs[-1].ended_at is None:
            return self.runs[-1]
        return None


@dataclass(frozen=True)
class Voided:
    """An event that was not valid at its position: it changed nothing."""

    seq: int
    type: str
    reason: str
    #: True when a rule failed unexpectedly (a bug or a hostile event the contract let
    #: through), not by an `Invalid` check: the services dead-letter such events.
    fault: bool = False


#: How many voided events are kept for inspection (all are counted).
VOIDED_KEPT = 100


@dataclass(frozen=True)
class Tombstone:
    """What the state keeps of a job that ended and left `ClusterState.jobs`
    (`gpuloom.state.retention`): enough to answer dependencies, duplicate
    submissions and idempotency keys, and who owned it, for `RETENTION`."""

    phase: str
    #: When it ended (the log's time of its final event).
    ended_at: datetime
    user: str
    account: str
    array_id: str | None = None
    idempotency_key: str | None = None
    #: When its last placement was made (None: never placed), for the gauge of recent
    #: placements: a short job is placed, ends and leaves within the same minute.
    placed_at: datetime | None = None
    #: Why it was rejected (rejected jobs only): a pod's job is asked about again by
    #: kube-scheduler long after it left, and the pod is told why (docs/kubernetes.md).
    reason: str | None = None


#: How many of the latest submissions' specs the state keeps: placement's typical
#: workload (FGD) is made of the latest ones, whether they ended or not.
RECENT_SPECS_KEPT = 1000


@dataclass
class ClusterState:
    seq: int = 0
    nodes: dict[str, NodeState] = field(default_factory=dict)
    jobs: dict[str, JobState] = field(default_factory=dict)
    #: Jobs in phase "queued", waiting for placement.
    queued: set[str] = field(default_factory=set)
    #: Jobs in phase "submitted"/"admitted" (admission and queue work lists).
    submitted: set[str] = field(default_factory=set)
    admitted: set[str] = field(default_factory=set)
    #: Jobs in phase "placed": placed and not started yet (the users' limit on jobs
    #: waiting to start counts them, `QueuePolicySet.unstarted_per_node`).
    placed: set[str] = field(default_factory=set)
    #: Elastic gangs placed or running (`JobSpec.min_replicas`): those placement may grow.
    elastic: set[str] = field(default_factory=set)
    #: Jobs in phase "placed"/"running", per node.
    on_node: dict[str, set[str]] = field(default_factory=dict)
    #: Jobs that ended a run and still have an uncharged attempt.
    uncharged: set[str] = field(default_factory=set)
    #: Pending jobs with a cancel request (queue's work list).
    cancel_pending: set[str] = field(default_factory=set)
    #: Queued jobs that name dependencies (`spec.depends_on`): the queue's work list of
    #: jobs that may have to be cancelled because a dependency can never be met. Kept
    #: apart from `queued` so that a deep backlog is not walked at every decision.
    queued_with_dependencies: set[str] = field(default_factory=set)
    #: Queued jobs that were preempted for another job (`JobState.yields_to` set): the
    #: few that `queueing.order.behind_their_preemptors` may move.
    queued_yielding: set[str] = field(default_factory=set)
    idempotency_keys: dict[str, str] = field(default_factory=dict)
    #: Job arrays by id: how many tasks (`<id>-0` .. `<id>-<n-1>`).
    arrays: dict[str, int] = field(default_factory=dict)
    #: Job id -> the jobs that depend on it (depends_on), to refresh their reason.
    dependents: dict[str, set[str]] = field(default_factory=dict)
    usage_by_account: dict[str, int] = field(default_factory=dict)
    usage_by_user: dict[str, int] = field(default_factory=dict)
    #: The latest AuditCompleted (GET /v1/audit).
    last_audit: AuditCompleted | None = None
    #: The queue's priority weights and half-life (QueuePolicySet); None: the defaults.
    queue_policy: QueuePolicySet | None = None
    #: Fair queuing's clock: the highest `queue_tag` placed so far, and per user the
    #: highest tag given to one of their jobs (only those above the clock matter:
    #: `rules.jobs.fair_tag` forgets the rest).
    fair_clock: int = 0
    user_tags: dict[str, int] = field(default_factory=dict)
    #: The latest EASY-backfill reservation (JobReserved); stale once its job left the queue.
    reservation: JobReserved | None = None
    #: The log's own time: the latest `at` folded (ageing and decay never read a clock).
    clock: datetime | None = None
    #: Accounts created by admins (jobs may name others: they count with 1 share).
    accounts: dict[str, AccountState] = field(default_factory=dict)
    #: Per account, GPU-milli-seconds of ended runs, decayed with the policy's half-life.
    decayed_usage: dict[str, DecayedUsage] = field(default_factory=dict)
    #: Priority classes by name (PriorityClassSet, PriorityClassDeleted).
    priority_classes: dict[str, PriorityClass] = field(default_factory=dict)
    #: Limits by (scope, name): ("user", "alice"), ("account", "team-a"), ("default",
    #: "user"), CLUSTER_TOTAL (LimitsSet).
    limits: dict[tuple[str, str], IdentityLimits] = field(default_factory=dict)
    #: Jobs not final (submitted to running) per ("user", u), ("account", a) and
    #: CLUSTER_TOTAL, kept as jobs are submitted and end (`max_submit_jobs` reads them;
    #: an identity leaves when its count is 0).
    live_jobs: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Advance reservations by name, until they end (ReservationCreated ... ReservationEnded).
    reservations: dict[str, AdvanceReservation] = field(default_factory=dict)
    #: Reservation name -> the jobs that name it and wait (submitted to queued): the queue
    #: cancels them when it is gone (ended or deleted).
    reservation_waiters: dict[str, set[str]] = field(default_factory=dict)
    #: Webhooks by id (WebhookRegistered, WebhookDisabled; WebhookDeleted removes one).
    webhooks: dict[str, Webhook] = field(default_factory=dict)
    #: Jobs that ended and were forgotten (retention.py), for RETENTION after they left.
    tombstones: dict[str, Tombstone] = field(default_factory=dict)
    #: (when it left, job id) in the order jobs left `jobs`; entries before
    #: `retired_head` have expired (the list is compacted now and then).
    retired: list[tuple[datetime, str]] = field(default_factory=list)
    retired_head: int = 0
    #: Array id -> (its tasks not yet expired, the array's idempotency key).
    array_left: dict[str, tuple[int, str | None]] = field(default_factory=dict)
    #: Every account a job ever named (fair share normalises shares over them).
    job_accounts: set[str] = field(default_factory=set)
    #: Specs of the latest submissions, oldest first (at most 2 x RECENT_SPECS_KEPT).
    recent_specs: list[JobSpec] = field(default_factory=list)
    #: Jobs forgotten so far, by final phase, and the placements they had (metrics' totals).
    forgotten_by_phase: dict[str, int] = field(default_factory=dict)
    forgotten_attempts: int = 0
    applied: int = 0
    voided: int = 0
    #: Of the voided events, those a fold rule failed on unexpectedly (`Voided.fault`).
    faults: int = 0
    recent_voided: list[Voided] = field(default_factory=list)
    #: Events whose `at` was too far from the log's own timestamp, and was bounded.
    skewed: int = 0
    recent_skewed: list[Voided] = field(default_factory=list)

    def array_tasks(self, array_id: str) -> list[str]:
        """The job ids of the tasks of array `array_id`, by index (none if unknown)."""
        return [array_task_id(array_id, index) for index in range(self.arrays.get(array_id, 0))]

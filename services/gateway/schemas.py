"""Shapes of the REST API's answers (requests reuse `gpuloom.events.JobSpec`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator


class Submitted(BaseModel):
    id: str
    state: str
    #: For a job array: the ids of its tasks, by index (`<array id>-<index>`).
    tasks: list[str] | None = None


class CancelAccepted(BaseModel):
    id: str
    state: str
    cancel_requested: bool


class Job(BaseModel):
    id: str
    name: str
    user: str
    account: str
    state: str
    reason: str | None
    node: str | None
    gpus: list[int]
    gpus_requested: int
    gpu_model: list[str]
    priority: int
    #: Hidden (null) unless the caller may see the job's details: its user, a
    #: coordinator of its account, or an operator.
    command: list[str] | None
    time_limit_s: int | None
    attempt: int
    #: Times it was requeued because a GPU failed under it (it then goes first among
    #: the jobs of its priority); `reason` says which GPU and why.
    requeues: int = 0
    cancel_requested: bool
    exit_code: int | None
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    #: The resource request beyond whole GPUs (fraction, CPU, memory, pool, locality...).
    request: dict[str, Any] | None = None
    #: The current (or last) placement: each replica's host, GPU slices (local and
    #: remote) and where it stands.
    placement: list[ReplicaPlacement] | None = None
    #: For a job array's own id: its tasks and how many are in each state.
    array: ArraySummary | None = None


class ReplicaPlacement(BaseModel):
    """One replica of a job's placement (a gang has several: docs/distributed.md)."""

    host: str
    #: Its GPU slices: node, index, uuid, milli (1000: whole), memory_mib.
    slices: list[dict[str, Any]]
    cpu_milli: int = 0
    memory_mib: int = 0
    #: Its number in the gang (None in rows written before replicas were numbered).
    replica: int | None = None
    #: `placed`, `running`, or how it ended (`succeeded`, `failed`, ...); an elastic
    #: gang's replica a shrink stops is `leaving`, then `left`; None in rows written
    #: before replicas had a state.
    state: str | None = None
    exit_code: int | None = None
    reason: str | None = None


class ArrayTask(BaseModel):
    """One task of a job array, as its array's page lists it."""

    id: str
    state: str
    node: str | None = None
    exit_code: int | None = None


class ArraySummary(BaseModel):
    tasks: list[str]
    #: State -> number of tasks in it.
    states: dict[str, int]
    #: Each task in index order: its state, where it ran last, its exit code.
    members: list[ArrayTask] = []


class JobList(BaseModel):
    jobs: list[Job]
    total: int


class LoggedEvent(BaseModel):
    seq: int
    id: str
    type: str
    v: int
    at: datetime
    by: str
    correlation_id: str | None = None
    causation_id: str | None = None
    data: dict[str, Any]
    #: Who asked, for an event a request caused (the authenticated user at the gateway).
    principal: str | None = None


class JobEvents(BaseModel):
    job_id: str
    events: list[LoggedEvent]


class JobLogs(BaseModel):
    job_id: str
    node: str
    attempt: int | None
    #: The gang's replica these are of (0 for a job of one replica).
    replica: int = 0
    #: The attempts of this replica its node holds logs of.
    attempts: list[int] = Field(default_factory=list)
    stdout: str
    stderr: str


class GpuHolder(BaseModel):
    job_id: str
    milli: int
    memory_mib: int


class GpuFaultView(BaseModel):
    """Why a GPU is out of service (GpuUnhealthy), until an operator resumes it."""

    #: `xid`, `ecc`, `retired_pages`, `unresponsive` or `injected`.
    check: str
    evidence: str
    at: datetime


class Gpu(BaseModel):
    index: int
    uuid: str
    model: str
    memory_mib: int
    pool: str = "physical"
    allocated: bool
    #: A holder (the only one of a whole GPU); all of them are in `holders`.
    job_id: str | None
    milli_allocated: int = 0
    memory_allocated_mib: int = 0
    holders: list[GpuHolder] = []
    #: Out of service (placement leaves it) since a health check failed; null: in service.
    unhealthy: GpuFaultView | None = None


class Node(BaseModel):
    name: str
    state: str
    simulated: bool
    labels: dict[str, str]
    cpu_milli: int
    memory_mib: int
    gpus: list[Gpu]
    lends_remote_vgpu: bool = False
    #: `enforced` (the agent stops a job over its GPU memory slice) or `advisory`.
    isolation: str = "advisory"
    #: Container runtimes that run jobs naming an image (`podman`); [] for none, None
    #: in rows written before nodes reported them.
    runtimes: list[str] | None = None
    #: Why an admin cordoned the node; null: it takes new work.
    cordoned: str | None = None
    #: Its place in the cluster's topology, level -> domain, tightest level first
    #: (`{"nvlink": "nvl-a", "rack": "r1", "block": "b1"}`); {} where it names none.
    topology: dict[str, str] = {}

    @field_validator("topology", mode="before")
    @classmethod
    def _places_as_a_mapping(cls, value: Any) -> Any:
        """The row keeps the places in order (a list); the answer is a mapping in order."""
        if value is None:
            return {}
        if isinstance(value, list):
            return {place["level"]: place["domain"] for place in value}
        return value


class NodeList(BaseModel):
    nodes: list[Node]


class AccountUsage(BaseModel):
    account: str
    gpu_seconds: float
    jobs: int


class UserUsage(BaseModel):
    user: str
    account: str
    gpu_seconds: float
    jobs: int


class ModelUsage(BaseModel):
    gpu_model: str
    gpu_seconds: float
    jobs: int


class RunningUsage(BaseModel):
    """GPU time of one user's runs going on under one account, since each run's last
    charge: used, not yet charged (accounting charges a run every interval and at its end)."""

    user: str
    account: str
    gpu_seconds: float
    jobs: int


class Usage(BaseModel):
    """GPU time charged in [since, until): per account, per user and per GPU model.

    A fraction counts by its share: 0.25 GPU for an hour is 900 GPU-seconds. `running`:
    what runs going on now have used since they were last charged (`as_of` the gateway's
    clock; both absent when nothing runs), not in the charged figures yet.
    """

    since: datetime | None = None
    until: datetime | None = None
    accounts: list[AccountUsage]
    users: list[UserUsage]
    gpu_models: list[ModelUsage] = []
    running: list[RunningUsage] = []
    as_of: datetime | None = None


class UsageRecord(BaseModel):
    """One charged run of a job (as `sacct` shows)."""

    job_id: str
    attempt: int
    user: str
    account: str
    gpus: int
    seconds: float
    gpu_seconds: float
    charged_at: datetime
    #: Its GPU time by GPU model (gpu_seconds split; JSON only, not in the CSV).
    gpu_models: dict[str, float] = Field(default_factory=dict)


class UsageRecords(BaseModel):
    records: list[UsageRecord]


class Health(BaseModel):
    status: str
    nats: bool
    projection_seq: int


class Problem(BaseModel):
    """An error (RFC 9457 problem details, `application/problem+json`): `detail` says
    what went wrong (services/gateway/problems.py answers every error so)."""

    #: Always `about:blank`: the status says what kind of error it is.
    type: str
    #: The status phrase (`Not Found`).
    title: str
    status: int
    detail: str


class FieldError(BaseModel):
    """One invalid field: where (`["body", "gpus"]`), what is wrong, and its kind."""

    loc: list[str | int]
    msg: str
    type: str


class ValidationProblem(Problem):
    """A 422: `detail` sums up every field error, `errors` lists them."""

    errors: list[FieldError]


class NodeRemovedAnswer(BaseModel):
    node: str
    #: Stream sequence of the NodeRemoved event.
    seq: int


class PoolChangeAccepted(BaseModel):
    node: str
    gpu: int
    pool: str
    #: Stream sequence of the GpuPoolChanged event; None when the GPU already was there.
    seq: int | None


class GpuResumed(BaseModel):
    node: str
    gpu: int
    #: Stream sequence of the GpuHealthy event.
    seq: int


class AuditView(BaseModel):
    """The latest audit in the log (`gpuloom audit` writes one per run)."""

    audited: bool
    #: How far the gateway has read the log (decisions after `to_seq` are not audited yet).
    log_seq: int
    from_seq: int | None = None
    to_seq: int | None = None
    verified: int = 0
    mismatch_count: int = 0
    mismatches: list[str] = []
    seconds: float | None = None


class JobExplanation(BaseModel):
    """Why a job is where it is (`gpuloom explain`)."""

    id: str
    state: str
    #: Dependency, Resources, Priority or Held for a pending job; None otherwise.
    reason: str | None
    detail: str | None = None
    #: 1-based place in the queue of jobs placement may place.
    position: int | None = None
    ahead: list[str] = []
    #: Per node: "fits", or the first rule that keeps the job off it.
    nodes: dict[str, str] = {}
    #: When it could start if the running jobs end at their time limits.
    estimated_start: datetime | None = None


class QueuedJob(BaseModel):
    """One pending job with its priority factors (as `sprio` shows them)."""

    position: int
    id: str
    user: str
    account: str
    priority: int
    #: Factors in [0, 1].
    age: float
    fair_share: float
    size: float
    #: Priority points: priority + the weighted factors.
    points: float
    #: Why it waits, when it is not just its turn (Dependency, Held).
    reason: str | None = None


class Queue(BaseModel):
    weights: dict[str, float]
    jobs: list[QueuedJob]


class Ready(BaseModel):
    ready: bool
    status: Literal["ready", "starting", "lagging", "unavailable"]
    #: Events in the log the projection has not folded and written yet (None: unknown).
    lag: int | None
    stream_seq: int | None
    written_seq: int
    max_lag: int
    quarantined: int
    detail: str


class QuarantinedRow(BaseModel):
    kind: str
    key: str
    seq: int
    error: str
    row: Any
    at: datetime


class Projection(BaseModel):
    name: str
    #: Last stream sequence the projection committed (its checkpoint row).
    checkpoint: int
    #: This gateway's live projection only: sequence it has folded and written.
    written_seq: int | None = None
    #: Events it has not written yet (None: unknown, the log is unreachable).
    lag: int | None
    quarantined: int
    rows: list[QuarantinedRow]


class Projections(BaseModel):
    stream_seq: int | None
    projections: list[Projection]

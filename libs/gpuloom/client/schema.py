"""Shapes of the gateway's JSON answers, as the REST contract states them.

These are `TypedDict`s, not validating models: the client hands back the JSON
it received unchanged (so `--json` prints exactly what the gateway said) and
the types only document and check the fields that code reads.
"""

from __future__ import annotations

from typing import Any, NotRequired, TypedDict

#: States after which a job never changes again.
FINAL_STATES: frozenset[str] = frozenset(
    {"rejected", "succeeded", "failed", "cancelled", "timed_out"}
)


class SubmitAnswer(TypedDict):
    id: str
    state: str
    #: For a job array: the ids of its tasks, by index.
    tasks: NotRequired[list[str] | None]


class Job(TypedDict):
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
    #: None: another user's job, whose command the caller may not see.
    command: list[str] | None
    attempt: int
    #: Times it was requeued because a GPU failed under it.
    requeues: NotRequired[int]
    cancel_requested: bool
    exit_code: int | None
    submitted_at: str | None
    started_at: str | None
    finished_at: str | None
    #: Only for a job array's own id: its tasks and how many are in each state.
    array: NotRequired[ArraySummary | None]
    #: The resources asked for beside the GPUs (`replicas`, pool, fractions, ...).
    request: NotRequired[dict[str, Any] | None]
    #: Every replica of the current (or last) attempt: host, slices, state, exit code.
    placement: NotRequired[list[ReplicaView] | None]


class ReplicaView(TypedDict):
    host: str
    slices: list[dict[str, Any]]
    cpu_milli: int
    memory_mib: int
    #: None in rows written before replicas were numbered and had a state.
    replica: int | None
    state: str | None
    exit_code: int | None
    reason: str | None


class ArrayTask(TypedDict):
    id: str
    state: str
    node: str | None
    exit_code: int | None


class ArraySummary(TypedDict):
    tasks: list[str]
    states: dict[str, int]
    members: NotRequired[list[ArrayTask]]


class JobList(TypedDict):
    jobs: list[Job]
    total: int


class CancelAnswer(TypedDict):
    id: str
    state: str
    cancel_requested: bool


class EventRecord(TypedDict):
    seq: int
    id: str
    type: str
    v: int
    at: str
    by: str
    data: dict[str, Any]
    #: Who asked, for an event a request caused (an operator acting for a user).
    principal: NotRequired[str | None]


class JobEvents(TypedDict):
    job_id: str
    events: list[EventRecord]


class JobLogs(TypedDict):
    job_id: str
    node: str | None
    #: None: the job never ran (no attempt's logs to show).
    attempt: int | None
    #: The gang's replica these are of, and the attempts of it its node keeps.
    replica: int
    attempts: list[int]
    stdout: str
    stderr: str


class GpuFault(TypedDict):
    check: str
    evidence: str
    at: str


class Gpu(TypedDict):
    index: int
    uuid: str
    model: str
    memory_mib: int
    allocated: bool
    job_id: str | None
    #: Out of service since a health check failed (`gpuloom gpus resume` returns it).
    unhealthy: NotRequired[GpuFault | None]


class Node(TypedDict, total=False):
    name: str
    state: str
    simulated: bool
    labels: dict[str, str]
    cpu_milli: int
    memory_mib: int
    gpus: list[Gpu]
    cordoned: str | None
    runtimes: list[str] | None
    #: level -> domain, tightest level first; {} where the node names none.
    topology: dict[str, str]


class NodeList(TypedDict):
    nodes: list[Node]


class AccountUsage(TypedDict):
    account: str
    gpu_seconds: float
    jobs: int


class UserUsage(TypedDict):
    user: str
    account: str
    gpu_seconds: float
    jobs: int


class ModelUsage(TypedDict):
    gpu_model: str
    gpu_seconds: float
    jobs: int


class RunningUsage(TypedDict):
    user: str
    account: str
    gpu_seconds: float
    jobs: int


class Usage(TypedDict):
    accounts: list[AccountUsage]
    users: list[UserUsage]
    gpu_models: NotRequired[list[ModelUsage]]
    #: Runs going on: GPU time since their last charge, not charged yet.
    running: NotRequired[list[RunningUsage]]


class Health(TypedDict):
    status: str
    nats: bool
    projection_seq: int


class QueuedJob(TypedDict):
    position: int
    id: str
    user: str
    account: str
    priority: int
    age: float
    fair_share: float
    size: float
    points: float
    reason: str | None


class Queue(TypedDict):
    weights: dict[str, float]
    jobs: list[QueuedJob]


class JobExplanation(TypedDict):
    id: str
    state: str
    reason: str | None
    detail: str | None
    position: int | None
    ahead: list[str]
    nodes: dict[str, str]
    estimated_start: str | None


class Quota(TypedDict):
    resource: str
    nominal: int | None
    borrowing_limit: int | None
    cap: int | None


class Account(TypedDict):
    name: str
    parent: str | None
    shares: int
    description: str
    quotas: list[Quota]


class AccountList(TypedDict):
    accounts: list[Account]


class UsageRecord(TypedDict):
    job_id: str
    attempt: int
    user: str
    account: str
    gpus: int
    seconds: float
    gpu_seconds: float
    charged_at: str


class UsageRecords(TypedDict):
    records: list[UsageRecord]


class PriorityClass(TypedDict):
    name: str
    priority: int
    may_preempt: bool
    users: list[str]
    accounts: list[str]
    description: str


class PriorityClassList(TypedDict):
    classes: list[PriorityClass]
    default: str


class Limits(TypedDict):
    scope: str
    name: str
    max_submit_jobs: int | None
    max_array_size: int | None
    max_gpus: int | None


class LimitBody(TypedDict):
    max_submit_jobs: int | None
    max_array_size: int | None
    max_gpus: int | None


class LimitsList(TypedDict):
    limits: list[Limits]
    defaults: dict[str, LimitBody]


class ReservedGpuRef(TypedDict):
    node: str
    index: int


class Reservation(TypedDict):
    name: str
    start: str
    end: str
    gpus: list[ReservedGpuRef]
    nodes: list[str]
    users: list[str]
    accounts: list[str]
    #: `maint`, `ignore_jobs`.
    flags: list[str]
    description: str
    started: bool
    #: `pending` until placement wrote its start, then `active`.
    state: str


class ReservationList(TypedDict):
    reservations: list[Reservation]


class DeadLetter(TypedDict):
    service: str | None
    seq: int | None
    subject: str | None
    reason_kind: str | None
    reason: str | None
    at: str | None


class DeadLetterList(TypedDict):
    stream: str
    total: int
    dead_letters: list[DeadLetter]

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
    cancel_requested: bool
    exit_code: int | None
    submitted_at: str | None
    started_at: str | None
    finished_at: str | None
    #: Only for a job array's own id: its tasks and how many are in each state.
    array: NotRequired[ArraySummary | None]


class ArraySummary(TypedDict):
    tasks: list[str]
    states: dict[str, int]


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
    attempt: int
    stdout: str
    stderr: str


class Gpu(TypedDict):
    index: int
    uuid: str
    model: str
    memory_mib: int
    allocated: bool
    job_id: str | None


class Node(TypedDict, total=False):
    name: str
    state: str
    simulated: bool
    labels: dict[str, str]
    cpu_milli: int
    memory_mib: int
    gpus: list[Gpu]
    cordoned: str | None


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


class Usage(TypedDict):
    accounts: list[AccountUsage]
    users: list[UserUsage]
    gpu_models: NotRequired[list[ModelUsage]]


class Health(TypedDict):
    status: str
    nats: bool
    projection_seq: int

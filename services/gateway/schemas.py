"""Shapes of the REST API's answers (requests reuse `gpuloom.events.JobSpec`)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel


class Submitted(BaseModel):
    id: str
    state: str


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
    command: list[str]
    time_limit_s: int | None
    attempt: int
    cancel_requested: bool
    exit_code: int | None
    submitted_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


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


class JobEvents(BaseModel):
    job_id: str
    events: list[LoggedEvent]


class JobLogs(BaseModel):
    job_id: str
    node: str
    attempt: int | None
    stdout: str
    stderr: str


class Gpu(BaseModel):
    index: int
    uuid: str
    model: str
    memory_mib: int
    allocated: bool
    job_id: str | None


class Node(BaseModel):
    name: str
    state: str
    simulated: bool
    labels: dict[str, str]
    cpu_milli: int
    memory_mib: int
    gpus: list[Gpu]


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


class Usage(BaseModel):
    accounts: list[AccountUsage]
    users: list[UserUsage]


class Health(BaseModel):
    status: str
    nats: bool
    projection_seq: int


class Problem(BaseModel):
    detail: str

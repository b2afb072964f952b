"""The bodies the gateway accepts for a job: what a client sends, apart from the routes
that take it (POST /v1/jobs, POST /v1/job-batches) and from the policy that checks it
(`submit_policy`), which both name it.

The HTTP contract is the gateway's own: `JobRequest` does not inherit the event
payload `JobSpec`, so a change to the event cannot change the API by itself. It carries
every field of `JobSpec` with the same types and checks, but for the ones it leaves to
the gateway (`DECIDED`: a client may leave them out, the gateway fills them in), and
`submitting.job_spec` is the one place a request becomes a `JobSpec`.
`tests/unit/gateway/test_job_request.py` fails when the two drift apart.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import ConfigDict, Discriminator, Field, Tag, field_validator, model_validator

from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.jobs import (
    SIGNAL_BEFORE_MOST_S,
    SignalName,
    check_gpu_request,
    check_replica_range,
    check_signal,
    checked_command,
)
from gpuloom.events.policies import PRIORITY_MAX, PRIORITY_MIN
from gpuloom.events.text import (
    INT32_MAX,
    LOADER_ENV_ALLOWED,
    RESERVED_ENV_PATTERN,
    EnvName,
    ExecWord,
    ImageRef,
    JobName,
    LabelKey,
    LabelValue,
    ModelName,
    TopologyName,
    UserName,
)
from services.gateway.bodies import Body

#: Fields of `JobSpec` a request may leave out, which the gateway decides (the
#: token's user; the default class, and the class's priority): optional here, and
#: required (or defaulted) in the event.
DECIDED = frozenset({"user", "priority", "priority_class"})
#: Fields of `JobSpec` a request does not carry at all: add a new event field here, or
#: to `JobRequest`, on purpose. `kubernetes`: only the scheduler extender submits pods.
LEFT_OUT: frozenset[str] = frozenset({"kubernetes"})
#: Fields of `JobSpec` a request carries in another shape: an elastic gang's
#: `min_replicas` is `replicas: {"min": m, "max": n}` (n is `JobSpec.replicas`).
RESHAPED = frozenset({"min_replicas"})


def _what_jobspec_checks(schema: dict[str, Any]) -> None:
    """Say in the request's schema what JobRequest checks beyond its fields' types:
    `command[0]` is not empty; `env` sets no variable the scheduler sets (`_check_env`);
    a fraction (`gpu_milli`) needs `gpus >= 1` and is not from the physical pool;
    `gpu_memory_mib` needs `gpu_milli`. (The cluster's MaxTime is a setting: apidocs.)"""
    command = schema["properties"]["command"]
    command["prefixItems"] = [{**command["items"], "minLength": 1}]
    names = schema["properties"]["env"]["propertyNames"]
    names["anyOf"] = [
        {"not": {"pattern": RESERVED_ENV_PATTERN}},
        {"enum": list(LOADER_ENV_ALLOWED)},
    ]
    fraction = {"required": ["gpu_milli"], "properties": {"gpu_milli": {"type": "integer"}}}
    schema["allOf"] = [
        {
            "if": fraction,
            "then": {"properties": {"gpus": {"minimum": 1}, "pool": {"enum": ["vgpu", "any"]}}},
        },
        {
            "if": {
                "required": ["gpu_memory_mib"],
                "properties": {"gpu_memory_mib": {"type": "integer"}},
            },
            "then": fraction,
        },
    ]


class Dependency(Body):
    """Run only after job `job` ended `succeeded` (or ended at all, with `finished`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str = Field(pattern=SUBJECT_TOKEN.pattern)
    when: Literal["succeeded", "finished"] = "succeeded"


class CheckpointSignal(Body):
    """`name` (`USR1`, ...) `before_s` seconds before the job is stopped."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: SignalName
    before_s: int = Field(ge=1, le=SIGNAL_BEFORE_MOST_S)


class ReplicaRange(Body):
    """An elastic gang (docs/distributed.md): it starts once `min` replicas fit (with
    more when they fit), grows toward `max`, and shrinks back to `min` rather than
    being stopped by a preemption."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    min: int = Field(ge=1, le=1024)
    max: int = Field(ge=1, le=1024)

    @model_validator(mode="after")
    def _ordered(self) -> ReplicaRange:
        check_replica_range(self.min, self.max)
        return self


def _replicas_shape(value: Any) -> str:
    return "range" if isinstance(value, dict | ReplicaRange) else "count"


#: A gang's size: a number, or an elastic gang's range (an error names which it took).
Replicas = Annotated[
    Annotated[int, Field(ge=1, le=1024), Tag("count")] | Annotated[ReplicaRange, Tag("range")],
    Discriminator(_replicas_shape),
]


class TopologyRequest(Body):
    """Keep the replicas inside one domain of `level` (`required`), or in as few domains
    as placement can, the tightest level first (`preferred`): docs/topology.md."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: TopologyName
    mode: Literal["required", "preferred"] = "required"


class JobRequest(Body):
    """A job as submitted: a JobSpec whose `user` may be left out (the token's user),
    and whose `priority_class` and `priority` may be too (the default class, and its
    priority)."""

    model_config = ConfigDict(frozen=True, extra="forbid", json_schema_extra=_what_jobspec_checks)

    name: JobName
    #: The job's user: the token's by default; another only for an operator.
    user: UserName | None = Field(default=None)
    account: str = Field(pattern=SUBJECT_TOKEN.pattern)
    command: list[ExecWord] = Field(min_length=1, max_length=4096)
    gpus: int = Field(ge=0, le=1024)
    gpu_milli: int | None = Field(default=None, ge=1, le=999)
    gpu_memory_mib: int | None = Field(default=None, ge=1, le=INT32_MAX)
    gpu_model: list[ModelName] = Field(default_factory=list, max_length=64)
    cpu_milli: int = Field(default=0, ge=0, le=INT32_MAX)
    memory_mib: int = Field(default=0, ge=0, le=INT32_MAX)
    pool: Literal["physical", "vgpu", "any"] = "any"
    locality: Literal["local-only", "local-first", "any"] = "local-only"
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64)
    #: A gang of this many replicas, or an elastic one: `{"min": m, "max": n}`.
    replicas: Replicas = 1
    depends_on: list[Dependency] = Field(default_factory=list, max_length=100)
    array: int | None = Field(default=None, ge=1, le=10_000)
    #: At most the class's priority (an operator may set any); absent: the class's.
    priority: int | None = Field(default=None, ge=PRIORITY_MIN, le=PRIORITY_MAX)
    priority_class: str | None = Field(default=None, pattern=SUBJECT_TOKEN.pattern)
    preemptible: bool = False
    time_limit_s: int | None = Field(default=None, gt=0, le=INT32_MAX)
    env: dict[EnvName, ExecWord] = Field(default_factory=dict, max_length=1024)
    image: ImageRef | None = None
    #: Keep the replicas inside one domain of a topology level (`required`), or in as
    #: few as placement can (`preferred`): docs/topology.md.
    topology: TopologyRequest | None = None
    #: Run only inside this advance reservation (docs/reservations.md), once it starts,
    #: on its GPUs; the job's user or account must be one it lets in.
    reservation: str | None = Field(default=None, pattern=SUBJECT_TOKEN.pattern)
    #: A signal `before_s` seconds before the job is stopped (its time limit, a
    #: preemption, a failed GPU), to checkpoint: sbatch's `--signal=USR1@60`.
    signal: CheckpointSignal | None = None

    @field_validator("command")
    @classmethod
    def _command_words_not_empty(cls, value: list[str]) -> list[str]:
        return checked_command(value)  # the event's rule: one implementation

    @field_validator("replicas", mode="before")
    @classmethod
    def _replicas_a_number_or_a_range(cls, value: Any) -> Any:
        if isinstance(value, bool | str):  # JSON's types: `true` is not 1 replica
            raise ValueError('must be a number, or {"min": m, "max": n}')
        return value

    @model_validator(mode="after")
    def _consistent_gpu_request(self) -> JobRequest:
        check_gpu_request(self.gpus, self.gpu_milli, self.gpu_memory_mib, self.pool)
        check_signal(self.signal.before_s if self.signal else None, self.time_limit_s)
        return self

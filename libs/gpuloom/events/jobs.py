"""Value objects shared by several job events: what a user asks for."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.text import (
    INT32_MAX,
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
from gpuloom.events.units import MILLI_PER_GPU


class Dependency(BaseModel):
    """Run only after job `job` ended `succeeded` (or ended at all, with `finished`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    job: str = Field(pattern=SUBJECT_TOKEN.pattern)
    when: Literal["succeeded", "finished"] = "succeeded"


def checked_command(command: list[str]) -> list[str]:
    """`command`, whose program (its first word) is not empty, or ValueError: the
    event's rule, and the gateway's request model's too."""
    if not command[0]:
        raise ValueError("command[0] (the program) must not be empty")
    return command


def check_gpu_request(
    gpus: int, gpu_milli: int | None, gpu_memory_mib: int | None, pool: str
) -> None:
    """ValueError unless the GPU request is consistent: a fraction slices at least one
    GPU of the vgpu pool, and its memory is asked only with a fraction."""
    if gpu_milli is not None:
        if gpus == 0:
            raise ValueError("gpu_milli needs gpus >= 1 (the number of GPUs sliced)")
        if pool == "physical":
            raise ValueError("a fraction (gpu_milli) comes from the vgpu pool, not physical")
    elif gpu_memory_mib is not None:
        raise ValueError("gpu_memory_mib applies to a fraction: set gpu_milli too")


class TopologyRequest(BaseModel):
    """Where a job's replicas must (`required`) or should (`preferred`) be: inside one
    domain of `level` (a rack, an NVLink domain), as Kueue's required and preferred
    topology; a preferred job goes to the fewest domains, the tightest level first."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: TopologyName
    mode: Literal["required", "preferred"] = "required"


#: Signals a job may ask for before it is stopped (sbatch's `--signal`), by name.
SignalName = Literal["USR1", "USR2", "TERM", "INT", "HUP", "QUIT", "CONT", "URG", "XCPU"]
#: The most seconds of warning a job may ask for: a preemption or a health stop waits
#: that long, so it is bounded (Slurm's own bound, 65535, is for time limits only).
SIGNAL_BEFORE_MOST_S = 3600


class CheckpointSignal(BaseModel):
    """Send `name` to the job's processes `before_s` seconds before its time limit, and
    `before_s` seconds before a preemption or a health stop's SIGTERM (sbatch's
    `--signal=USR1@60`): time to write a checkpoint (docs/faults.md)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: SignalName
    before_s: int = Field(ge=1, le=SIGNAL_BEFORE_MOST_S)


def check_signal(before_s: int | None, time_limit_s: int | None) -> None:
    """ValueError when a checkpoint signal `before_s` seconds before the time limit
    would come at or before the job's start: it must be under the time limit."""
    if before_s is not None and time_limit_s is not None and before_s >= time_limit_s:
        raise ValueError(
            f"signal.before_s ({before_s}) must be under time_limit_s ({time_limit_s})"
        )


def check_replica_range(least: int | None, most: int) -> None:
    """ValueError unless an elastic gang's minimum is at most its maximum."""
    if least is not None and least > most:
        raise ValueError(f"replicas.min ({least}) must be at most replicas.max ({most})")


#: A Kubernetes object name (DNS-1123 subdomain) and a namespace (DNS-1123 label).
KUBE_NAME = r"^[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?$"
KUBE_NAMESPACE = r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"
KUBE_UID = r"^[0-9a-fA-F-]{1,64}$"


class KubernetesPods(BaseModel):
    """The Kubernetes pod, or gang of pods, a job stands for (docs/kubernetes.md): the
    scheduler extender submitted it for kube-scheduler, and the job runs only on
    Kubernetes nodes (`NodeSpec.runtimes`), where their kubelets start the pods.

    One pod: its `name` and `uid`, the idempotency key of the job. A gang
    (`gpuloom.io/gang`): the gang's `name`, no `uid`; its `replicas` pods are the job's
    replicas, in the order of their names."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    namespace: str = Field(pattern=KUBE_NAMESPACE, max_length=63)
    name: str = Field(pattern=KUBE_NAME, max_length=253)
    uid: str | None = Field(default=None, pattern=KUBE_UID)

    @property
    def gang(self) -> bool:
        return self.uid is None


class JobSpec(BaseModel):
    """What a user submitted. Validated at the gateway; carried verbatim in JobSubmitted."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: JobName
    user: UserName
    #: An account name is a subject token, like the accounts admins create.
    account: str = Field(pattern=SUBJECT_TOKEN.pattern)
    command: list[ExecWord] = Field(min_length=1, max_length=4096)
    gpus: int = Field(ge=0, le=1024)
    #: A fraction of each GPU (1..999 milli-GPU, from the vGPU pool); None: whole GPUs.
    gpu_milli: int | None = Field(default=None, ge=1, le=999)
    #: GPU memory per slice; None: the same share of the GPU's memory as `gpu_milli`.
    gpu_memory_mib: int | None = Field(default=None, ge=1, le=INT32_MAX)
    gpu_model: list[ModelName] = Field(default_factory=list, max_length=64)
    cpu_milli: int = Field(default=0, ge=0, le=INT32_MAX)
    memory_mib: int = Field(default=0, ge=0, le=INT32_MAX)
    pool: Literal["physical", "vgpu", "any"] = "any"
    locality: Literal["local-only", "local-first", "any"] = "local-only"
    node_selector: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64)
    #: Replicas placed as a gang: all in one decision, or none. With `min_replicas`, an
    #: elastic gang: at most this many.
    replicas: int = Field(default=1, ge=1, le=1024)
    #: An elastic gang (REST `replicas: {"min": m, "max": n}`, docs/distributed.md): it
    #: starts once `min_replicas` fit (with more when they fit), grows toward `replicas`
    #: as GPUs free up, and shrinks down to `min_replicas` rather than being preempted.
    #: None: a fixed gang of `replicas`.
    min_replicas: int | None = Field(default=None, ge=1, le=1024)
    #: Jobs that must end first; the job waits (reason `Dependency`) until they do.
    depends_on: list[Dependency] = Field(default_factory=list, max_length=100)
    #: A job array of `array` tasks, each with GPULOOM_ARRAY_INDEX (JobArraySubmitted).
    array: int | None = Field(default=None, ge=1, le=10_000)
    #: The job's priority: higher goes first and may preempt lower preemptible jobs.
    #: At most its priority class's (the gateway sees to it; operators may pass it).
    priority: int = Field(default=0, ge=-1_000_000, le=1_000_000)
    #: The operator-defined class (PriorityClassSet) the job runs in: who may use it,
    #: its priority and whether it may preempt. None: a submission from before classes
    #: (or a bare spec in a test): its `priority` stands and it may preempt as before.
    priority_class: str | None = Field(default=None, pattern=SUBJECT_TOKEN.pattern)
    #: May be stopped (and requeued) for a job of a higher priority class.
    preemptible: bool = False
    #: Seconds; at most a 32-bit integer here, and at most the configured maximum
    #: (`GPULOOM_MAX_TIME_LIMIT_S`, Slurm's MaxTime) by admission.
    time_limit_s: int | None = Field(default=None, gt=0, le=INT32_MAX)
    env: dict[EnvName, ExecWord] = Field(default_factory=dict, max_length=1024)
    #: An OCI image to run the command in (docs/containers.md): only nodes with a
    #: container runtime (`NodeSpec.runtimes`) take the job. None: a plain process.
    image: ImageRef | None = None
    #: Keep the replicas close together (docs/topology.md): inside one domain of a
    #: level, or in as few domains as placement can. None: anywhere.
    topology: TopologyRequest | None = None
    #: Run only inside this advance reservation (docs/reservations.md), once it starts,
    #: on its GPUs; the job's user or account must be one it lets in.
    reservation: str | None = Field(default=None, pattern=SUBJECT_TOKEN.pattern)
    #: A signal before the job is stopped (time limit, preemption, a failed GPU), to
    #: checkpoint; None: SIGTERM only, then SIGKILL after the grace.
    signal: CheckpointSignal | None = None
    #: The Kubernetes pod(s) the job stands for; None: a job of gpuloom's own agents.
    kubernetes: KubernetesPods | None = None

    @field_validator("command")
    @classmethod
    def _command_words_not_empty(cls, value: list[str]) -> list[str]:
        return checked_command(value)

    @model_validator(mode="after")
    def _consistent_gpu_request(self) -> JobSpec:
        check_gpu_request(self.gpus, self.gpu_milli, self.gpu_memory_mib, self.pool)
        check_signal(self.signal.before_s if self.signal else None, self.time_limit_s)
        check_replica_range(self.min_replicas, self.replicas)
        return self

    @property
    def elastic(self) -> bool:
        return self.min_replicas is not None

    @property
    def least_replicas(self) -> int:
        """The replicas it needs to start: `min_replicas` for an elastic gang."""
        return self.min_replicas if self.min_replicas is not None else self.replicas

    @property
    def share_milli(self) -> int:
        """Milli-GPU per GPU: the fraction, or 1000 for whole GPUs."""
        return self.gpu_milli if self.gpu_milli is not None else MILLI_PER_GPU

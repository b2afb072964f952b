"""A pod as gpuloom reads it, and the job it becomes.

Everything here reads a pod as the Kubernetes API returns it (a JSON object) and
treats every field a pod's author controls as hostile: an annotation that is not one
gpuloom knows, a number that is not a number, a name past its bounds is a
`PodProblem` naming the annotation, never an exception out of the extender (the
extender shows it to the pod's owner as an event and as the reason in
`kubectl describe pod`).

Who a pod's job belongs to: its namespace is the job's user (Kubernetes' own tenancy
unit; an operator lists namespaces as members of gpuloom accounts), its account is
`gpuloom.io/account` or the cluster's default. The job's id is derived from the pod's
UID, and its idempotency key is the UID: the extender may be asked about the same
pod any number of times and submits it once.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import ValidationError
from ulid import ULID

from gpuloom.events import JobSpec
from gpuloom.events.jobs import KubernetesPods, TopologyRequest
from gpuloom.kube.vocabulary import (
    ACCOUNT,
    ASKED,
    GANG,
    GPU_MILLI,
    GPU_RESOURCE,
    LOCALITY,
    MODEL,
    POOL,
    PREEMPTIBLE,
    PRIORITY_CLASS,
    REPLICAS,
    TIME_LIMIT,
    TOPOLOGY,
    WRITTEN,
)

#: What a pod's annotation may hold, at most (the API allows 256 KiB for all of them).
ANNOTATION_MOST = 253
#: The most pods one gang may have (a JobSpec's replicas).
GANG_MOST = 1024
#: The longest idempotency key a pod's job gets (a longer gang's key is hashed).
KEY_MOST = 200
#: The longest job name (a longer pod's name is cut for it: the pod keeps its own).
NAME_MOST = 200

PodPhase = Literal["Pending", "Running", "Succeeded", "Failed", "Unknown"]


@dataclass(frozen=True, slots=True)
class PodProblem:
    """Why a pod cannot become a gpuloom job: the annotation (or field) at fault, and why."""

    field: str
    reason: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Pod:
    """What gpuloom needs of one pod that asks for `gpuloom.io/gpu`."""

    namespace: str
    name: str
    uid: str
    #: The GPUs it asks for: the sum of its containers' `gpuloom.io/gpu` limits (None
    #: when a limit is not a whole number: `problem` says so).
    gpus: int
    annotations: dict[str, str] = field(default_factory=dict)
    created: datetime = datetime(1970, 1, 1, tzinfo=UTC)
    #: `spec.nodeName`: where it is bound ("" while it is not).
    node_name: str = ""
    phase: PodPhase = "Pending"
    #: Its containers' exit code once it ended (the first that is not 0, else 0).
    exit_code: int | None = None
    #: It is being deleted (`metadata.deletionTimestamp`), or is gone from the API.
    deleting: bool = False
    priority_class_name: str = ""
    #: The uid of the pod's controller (a Job, a JobSet), if any: it names a gang's run.
    owner_uid: str = ""
    #: A limit that is not a whole number of GPUs, said once.
    problem: PodProblem | None = None
    #: kube-scheduler tried it and could not schedule it (`PodScheduled: False`).
    unschedulable: bool = False

    @property
    def ended(self) -> bool:
        return self.phase in ("Succeeded", "Failed")

    @property
    def gang(self) -> str | None:
        return self.annotations.get(GANG)

    @property
    def job_key(self) -> str:
        """The idempotency key of the pod's job: the pod's UID, or for a gang its
        namespace, name and controller (one key for all its pods, and a new one each
        time the controller is made again)."""
        if self.gang is None:
            return f"k8s:{self.uid}"
        key = f"k8s-gang:{self.namespace}/{self.gang}/{self.owner_uid or '-'}"
        if len(key) <= KEY_MOST:
            return key
        digest = hashlib.sha256(key.encode()).hexdigest()[:40]  # every part still counts
        return f"k8s-gang:{self.namespace}/{digest}"


def read_pod(obj: dict[str, Any]) -> Pod | None:
    """The pod in an API object, or None when it asks for no `gpuloom.io/gpu` (it is not
    gpuloom's: kube-scheduler never hands it to the extender) or is not a pod at all."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    if not isinstance(meta, dict) or not isinstance(spec, dict) or not isinstance(status, dict):
        return None
    gpus, problem = _gpus_asked(spec)
    if gpus is None and problem is None:
        return None
    annotations = meta.get("annotations") or {}
    owners = [o for o in meta.get("ownerReferences") or [] if isinstance(o, dict)]
    controller = next((o for o in owners if o.get("controller")), owners[0] if owners else {})
    return Pod(
        namespace=str(meta.get("namespace") or "default"),
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        gpus=gpus or 0,
        annotations={str(k): str(v) for k, v in annotations.items()}
        if isinstance(annotations, dict)
        else {},
        created=_timestamp(meta.get("creationTimestamp")),
        node_name=str(spec.get("nodeName") or ""),
        phase=_phase(status.get("phase")),
        exit_code=_exit_code(status),
        deleting=meta.get("deletionTimestamp") is not None,
        priority_class_name=str(spec.get("priorityClassName") or ""),
        owner_uid=str(controller.get("uid") or ""),
        problem=problem,
        unschedulable=any(
            isinstance(c, dict) and c.get("type") == "PodScheduled" and c.get("status") == "False"
            for c in status.get("conditions") or []
        ),
    )


def _gpus_asked(spec: dict[str, Any]) -> tuple[int | None, PodProblem | None]:
    """The sum of the containers' `gpuloom.io/gpu` limits (a request without a limit
    counts as its limit, as Kubernetes defaults one to the other); (None, None) when no
    container asks; a problem when one asks for something that is not a whole count."""
    total, asked = 0, False
    for container in spec.get("containers") or []:
        if not isinstance(container, dict):
            continue
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        value = limits.get(GPU_RESOURCE, (resources.get("requests") or {}).get(GPU_RESOURCE))
        if value is None:
            continue
        asked = True
        text = str(value)
        if not re.fullmatch(r"[0-9]{1,4}", text):
            where = f"containers[{container.get('name', '?')}].resources.limits"
            reason = f"{GPU_RESOURCE} must be a whole number of GPUs, not {text[:40]!r}"
            return 0, PodProblem(where, reason)
        total += int(text)
    return (total, None) if asked else (None, None)


def _timestamp(value: object) -> datetime:
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).astimezone(UTC)
    except ValueError:
        return datetime(1970, 1, 1, tzinfo=UTC)


def _phase(value: object) -> PodPhase:
    if value in ("Pending", "Running", "Succeeded", "Failed", "Unknown"):
        return value
    return "Pending"


def _exit_code(status: dict[str, Any]) -> int | None:
    """The pod's exit code once its containers ended: the first non-zero, else 0."""
    codes = []
    for container in status.get("containerStatuses") or []:
        terminated = ((container or {}).get("state") or {}).get("terminated")
        if isinstance(terminated, dict) and isinstance(terminated.get("exitCode"), int):
            codes.append(terminated["exitCode"])
    if not codes:
        return None
    return next((code for code in codes if code != 0), 0)


@dataclass(frozen=True, slots=True)
class PodDefaults:
    """What a pod that says nothing gets (settings)."""

    account: str = "default"
    #: Priority classes gpuloom knows: a pod's `spec.priorityClassName` is used when
    #: gpuloom has a class of that name (else the default class).
    classes: frozenset[str] = frozenset()
    default_class: str = "normal"
    #: The priority of each known class.
    priorities: tuple[tuple[str, int], ...] = ()


def job_spec(pod: Pod, defaults: PodDefaults) -> JobSpec | PodProblem:
    """The job `pod` becomes, or the first problem with what it asks (each annotation
    checked, an unknown `gpuloom.io/` one refused)."""
    if pod.problem is not None:
        return pod.problem
    try:
        return _job_spec(pod, defaults)
    except _Bad as bad:
        return bad.problem
    except ValidationError as exc:  # a value the event's own checks refuse
        error = exc.errors()[0]
        where = ".".join(str(part) for part in error["loc"]) or "pod"
        field = str(error["loc"][0]) if error["loc"] else "pod"
        return PodProblem(
            _ANNOTATION_OF.get(where, _ANNOTATION_OF.get(field, where)), str(error["msg"])
        )


#: The JobSpec field each annotation fills, for an error the event model found.
_ANNOTATION_OF = {
    "gpu_milli": GPU_MILLI,
    "pool": POOL,
    "gpu_model": MODEL,
    "gpu_model.0": MODEL,
    "locality": LOCALITY,
    "account": ACCOUNT,
    "priority_class": PRIORITY_CLASS,
    "time_limit_s": TIME_LIMIT,
    "topology.level": TOPOLOGY,
    "topology": TOPOLOGY,
    "level": TOPOLOGY,
    "mode": TOPOLOGY,
    "name": GANG,
    "kubernetes": GANG,
    "replicas": REPLICAS,
    "gpus": GPU_RESOURCE,
}


class _Bad(Exception):
    def __init__(self, problem: PodProblem) -> None:
        super().__init__(str(problem))
        self.problem = problem


def _bad(name: str, reason: str) -> _Bad:
    return _Bad(PodProblem(name, reason))


def _job_spec(pod: Pod, defaults: PodDefaults) -> JobSpec:
    notes = pod.annotations
    for name, value in sorted(notes.items()):
        if name.startswith("gpuloom.io/") and name not in ASKED and name not in WRITTEN:
            raise _bad(name, f"unknown annotation (gpuloom reads: {', '.join(ASKED)})")
        if name in ASKED and len(value) > ANNOTATION_MOST:
            raise _bad(name, f"at most {ANNOTATION_MOST} characters")
    if pod.gpus < 1:
        raise _bad(GPU_RESOURCE, "ask for at least 1 (a vGPU share: 1 with gpuloom.io/gpu-milli)")
    milli = _int(notes, GPU_MILLI, 1, 999)
    pool = _choice(notes, POOL, ("physical", "vgpu"), "vgpu" if milli is not None else "any")
    locality = _choice(notes, LOCALITY, ("local-only", "local-first"), "local-only")
    models = [m.strip() for m in notes.get(MODEL, "").split(",") if m.strip()]
    klass = notes.get(PRIORITY_CLASS) or (
        pod.priority_class_name if pod.priority_class_name in defaults.classes else ""
    )
    klass = klass or defaults.default_class
    priorities = dict(defaults.priorities)
    replicas = _int(notes, REPLICAS, 1, GANG_MOST) if pod.gang is not None else None
    if pod.gang is None and REPLICAS in notes:
        raise _bad(REPLICAS, f"a gang's size: set {GANG} too")
    if pod.gang is not None and replicas is None:
        raise _bad(REPLICAS, f"a gang ({GANG}) needs its number of pods")
    return JobSpec(
        name=(pod.gang or pod.name)[:NAME_MOST],
        user=pod.namespace,
        account=notes.get(ACCOUNT) or defaults.account,
        command=["kubernetes-pod", f"{pod.namespace}/{pod.gang or pod.name}"],
        gpus=pod.gpus,
        gpu_milli=milli,
        gpu_model=models,
        pool=pool,
        locality=locality,
        replicas=replicas or 1,
        priority=priorities.get(klass, 0),
        priority_class=klass,
        preemptible=_flag(notes, PREEMPTIBLE),
        time_limit_s=_duration(notes, TIME_LIMIT),
        topology=_topology(notes),
        kubernetes=KubernetesPods(
            namespace=pod.namespace,
            name=pod.gang or pod.name,
            uid=None if pod.gang is not None else pod.uid,
        ),
    )


def _int(notes: dict[str, str], name: str, least: int, most: int) -> int | None:
    text = notes.get(name)
    if text is None:
        return None
    if not re.fullmatch(r"[0-9]{1,9}", text.strip()):
        raise _bad(name, f"must be a whole number from {least} to {most}, not {text[:40]!r}")
    value = int(text)
    if not least <= value <= most:
        raise _bad(name, f"must be from {least} to {most}, not {value}")
    return value


def _choice(notes: dict[str, str], name: str, allowed: tuple[str, ...], default: str) -> str:
    text = notes.get(name)
    if text is None:
        return default
    if text not in allowed:
        raise _bad(name, f"must be one of {', '.join(allowed)}, not {text[:40]!r}")
    return text


def _flag(notes: dict[str, str], name: str) -> bool:
    text = notes.get(name)
    if text is None:
        return False
    if text not in ("true", "false"):
        raise _bad(name, f"must be true or false, not {text[:40]!r}")
    return text == "true"


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(notes: dict[str, str], name: str) -> int | None:
    """Seconds, from `3600`, `90s`, `30m`, `12h` or `2d`."""
    text = notes.get(name)
    if text is None:
        return None
    found = re.fullmatch(r"([0-9]{1,9})([smhd]?)", text.strip())
    if found is None:
        raise _bad(name, f"a duration such as 3600, 90s, 30m, 12h or 2d, not {text[:40]!r}")
    seconds = int(found[1]) * _UNITS[found[2] or "s"]
    if not 0 < seconds < 2**31:
        raise _bad(name, "must be more than 0 and under 68 years")
    return seconds


def _topology(notes: dict[str, str]) -> TopologyRequest | None:
    """`rack` (all pods inside one rack) or `rack:preferred` (as few racks as it can)."""
    text = notes.get(TOPOLOGY)
    if text is None:
        return None
    level, _, mode = text.partition(":")
    if mode not in ("", "required", "preferred"):
        raise _bad(TOPOLOGY, f"LEVEL or LEVEL:preferred, not {text[:40]!r}")
    return TopologyRequest(level=level, mode=mode or "required")


def job_id(pod: Pod) -> str:
    """The job id of the pod's job: a ULID made of the pod's creation time and a hash of
    its UID, so that every process that sees the pod names the same job, and the ids of
    pods sort as gpuloom's own ids do, by time."""
    digest = hashlib.sha256(pod.uid.encode()).digest()[:10]
    millis = int(pod.created.timestamp() * 1000) & ((1 << 48) - 1)
    return str(ULID.from_bytes(millis.to_bytes(6, "big") + digest))

"""The scheduler extender's answers to kube-scheduler, as functions of the folded state.

kube-scheduler asks the extender three things about a pod that asks for
`gpuloom.io/gpu` (`k8s.io/kube-scheduler/extender/v1`):

- **filter**: which of these nodes may take the pod. gpuloom's queue and placement
  decide: only the node gpuloom placed the pod's job on passes; every other node fails
  with gpuloom's own reason (explain's: queued behind whom, quota, GPU model,
  reservation...), which kube-scheduler writes into the pod's `FailedScheduling` event
  and `kubectl describe pod` shows. A pod gpuloom has not seen yet is submitted
  (`JobSubmitted`, its UID the idempotency key) and fails everywhere until placed.
- **prioritize**: the placed node scores 10, every other 0.
- **bind**: only to the node gpuloom placed it on, for the current attempt: the
  service then writes the annotations (`placement_annotations`) and the Binding.

No I/O here: the service (`services.extender`) reads the pod and writes to the log
and the API.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuloom.decide.explain import Shared, explain, reason_text
from gpuloom.events import JobSpec, JobSubmitted
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.kube.nodes import gpuloom_name, kube_name
from gpuloom.kube.pods import Pod, PodDefaults, PodProblem, job_id, job_spec
from gpuloom.kube.vocabulary import (
    ATTEMPT,
    JOB,
    NUDGED,
    PLACED_GPUS,
    PLACED_MEMORY,
    PLACED_NODE,
    PLACED_UUIDS,
    REPLICA,
    REPLICAS,
)
from gpuloom.state import ClusterState, JobState
from gpuloom.state.lifecycle import ON_NODE

#: How the watcher marks a pod whose job was queued (`watch.queued_mark`); its other
#: nudge (a pod gpuloom never heard of) is a bare number, which says nothing of the job.
QUEUED_PREFIX = "queued-"
#: The longest reason a node is given (kube-scheduler counts nodes per distinct reason).
REASON_MOST = 300


@dataclass(frozen=True, slots=True)
class FilterAnswer:
    """The nodes that pass and the reason of each that fails; `submit`: the event that
    makes the pod's job, to publish (and have acknowledged) before answering."""

    passed: list[str]
    failed: dict[str, str]
    submit: JobSubmitted | None = None
    #: What the pod waits for, for an event on the pod (None: it passed somewhere).
    waiting: str | None = None
    problem: PodProblem | None = None


@dataclass
class Reasons:
    """Why pods wait, computed once per folded state: one pass of placement explains
    every pod kube-scheduler asks about before the state changes. A service's state is
    one object folded on in place: its sequence says when it changed."""

    seq: int = -1
    shared: Shared | None = None
    said: dict[str, str] = field(default_factory=dict)

    def of(self, state: ClusterState, job: JobState) -> str:
        if self.seq != state.seq or self.shared is None or self.shared.state is not state:
            self.seq, self.shared, self.said = state.seq, Shared(state), {}
        found = self.said.get(job.job_id)
        if found is None:
            found = _waiting_reason(state, job, self.shared)
            self.said[job.job_id] = found
        return found


def _waiting_reason(state: ClusterState, job: JobState, shared: Shared | None) -> str:
    found = explain(state, job.job_id, brief=True, shared=shared)
    if found is None or found.reason is None:
        return f"gpuloom job {job.job_id} is {job.phase}"
    text = reason_text(found.reason, found.detail) or found.reason
    return f"gpuloom job {job.job_id} waits: {text}"


def pod_job(state: ClusterState, pod: Pod) -> tuple[str | None, JobState | None]:
    """The id of the pod's job (None: gpuloom has not folded its submission) and the
    job while the state holds it (None once it ended and was forgotten)."""
    found = state.idempotency_keys.get(pod.job_key)
    if found is None:
        return None, None
    return found, state.jobs.get(found)


def placed_later(state: ClusterState, pod: Pod) -> bool:
    """The pod's annotations name a placement (an attempt), or its job queued, that this
    state has not folded yet: the watcher wrote them from a fold further on."""
    found, job = pod_job(state, pod)
    if found is not None and job is None:
        return False  # ended and forgotten: nothing newer to wait for
    attempt = pod.annotations.get(ATTEMPT, "")
    if attempt.isdigit() and int(attempt) > (job.attempt if job is not None else 0):
        return True
    nudged = pod.annotations.get(NUDGED, "")
    queued = nudged.startswith(QUEUED_PREFIX) and nudged[len(QUEUED_PREFIX) :].isdigit()
    return queued and (job is None or job.phase in ("submitted", "admitted"))


def replica_of(pod: Pod, gang: list[str] | None, replicas: int) -> int | None:
    """The replica the pod is in its job of `replicas`: 0 for a lone pod; in a gang the
    one gpuloom wrote on it when it was placed (`gpuloom.io/replica`: it stays when
    other pods of the gang are gone), else its place among the gang's pods by name, once
    all of them exist and no more (None until then)."""
    if pod.gang is None:
        return 0
    written = pod.annotations.get(REPLICA, "")
    if written.isdigit() and int(written) < replicas:
        return int(written)
    if gang is None or pod.name not in gang or len(gang) != replicas:
        return None
    return sorted(gang).index(pod.name)


def filter_pod(
    state: ClusterState,
    pod: Pod,
    nodes: list[str],
    defaults: PodDefaults,
    reasons: Reasons,
    gang: list[str] | None = None,
) -> FilterAnswer:
    """kube-scheduler's filter of `pod` over `nodes` (their Kubernetes names): see the
    module doc. `gang`: the names of the pod's gang's pods that exist now."""
    found_id, job = pod_job(state, pod)
    if found_id is None:
        spec = job_spec(pod, defaults)
        if isinstance(spec, PodProblem):
            why = f"gpuloom cannot schedule this pod: {spec}"
            return FilterAnswer([], _all(nodes, why), waiting=why, problem=spec)
        submit = submission(pod, spec)
        why = f"gpuloom job {submit.job_id} submitted: waiting for admission and the queue"
        return FilterAnswer([], _all(nodes, why), submit=submit, waiting=why)
    if job is None:
        ended = state.tombstones.get(found_id)
        phase = ended.phase if ended is not None else "gone"
        why = f"gpuloom job {found_id} has ended ({phase}): delete the pod and create it again"
        if ended is not None and ended.reason:
            why = f"gpuloom job {found_id} was rejected: {ended.reason}"
        return FilterAnswer([], _all(nodes, why), waiting=why)
    if job.phase in ("rejected", "cancelled"):
        why = f"gpuloom job {found_id} was {job.phase}: {job.reason or 'no reason given'}"
        return FilterAnswer([], _all(nodes, why), waiting=why)
    if job.phase not in ON_NODE:
        why = reasons.of(state, job)
        return FilterAnswer([], _all(nodes, why), waiting=why)
    replica = replica_of(pod, gang, len(job.replicas))
    if replica is None:
        have = len(gang) if gang is not None else 0
        why = (
            f"gpuloom job {found_id} is placed; gang {pod.gang} has {have} pod(s) of the "
            f"{len(job.replicas)} its {REPLICAS} names: waiting for exactly that many"
        )
        return FilterAnswer([], _all(nodes, why), waiting=why)
    host = kube_name(job.replicas[replica].host)
    if host not in nodes:
        why = (
            f"gpuloom placed this pod on {host}, which kube-scheduler did not offer "
            "(its own filters refused it: CPU, memory, taints or affinity)"
        )
        return FilterAnswer([], _all(nodes, why), waiting=why)
    why = f"gpuloom placed this pod on {host}"
    return FilterAnswer([host], {n: _short(why) for n in nodes if n != host})


def prioritize_pod(state: ClusterState, pod: Pod, nodes: list[str]) -> list[tuple[str, int]]:
    """Each node's score, 0..10: 10 for the node the pod's replica is placed on."""
    _, job = pod_job(state, pod)
    hosts = {kube_name(r.host) for r in job.replicas} if job and job.phase in ON_NODE else set()
    return [(name, 10 if name in hosts else 0) for name in nodes]


@dataclass(frozen=True, slots=True)
class BindAnswer:
    """The annotations to write and the node to bind to, or the error to answer."""

    error: str | None
    annotations: dict[str, str] = field(default_factory=dict)


def bind_pod(state: ClusterState, pod: Pod, node: str, gang: list[str] | None = None) -> BindAnswer:
    """Whether `pod` may be bound to `node` (a Kubernetes name): only where gpuloom placed
    its replica in the current attempt; with the annotations that say which GPUs."""
    found_id, job = pod_job(state, pod)
    if job is None or job.phase not in ON_NODE:
        phase = job.phase if job is not None else "not known to gpuloom"
        return BindAnswer(f"gpuloom job {found_id or '?'} is {phase}, not placed: not bound")
    replica = replica_of(pod, gang, len(job.replicas))
    if replica is None:
        return BindAnswer(f"gpuloom job {job.job_id}: not every pod of gang {pod.gang} exists")
    host = job.replicas[replica].host
    if gpuloom_name(node) != host:
        return BindAnswer(f"gpuloom placed this pod on {kube_name(host)}, not {node}")
    return BindAnswer(None, placement_annotations(job, replica))


def placement_annotations(job: JobState, replica: int) -> dict[str, str]:
    """What gpuloom writes on a placed pod: its node, its GPUs (indices and UUIDs; a
    slice lent by another node as `node/index`), a share's memory, the job and attempt
    (the device plugin gives the container these GPUs at Allocate)."""
    assignment = job.replicas[replica]
    host = assignment.host
    indices = [
        str(s.index) if s.node == host else f"{kube_name(s.node)}/{s.index}"
        for s in assignment.slices
    ]
    notes = {
        PLACED_NODE: kube_name(host),
        PLACED_GPUS: ",".join(indices),
        PLACED_UUIDS: ",".join(s.uuid for s in assignment.slices),
        JOB: job.job_id,
        ATTEMPT: str(job.attempt),
    }
    if job.spec.kubernetes is not None and job.spec.kubernetes.gang:
        notes[REPLICA] = str(replica)
    if any(s.milli < MILLI_PER_GPU for s in assignment.slices):
        notes[PLACED_MEMORY] = ",".join(str(s.memory_mib) for s in assignment.slices)
    return notes


def submission(pod: Pod, spec: JobSpec) -> JobSubmitted:
    """The event that makes the pod's job: its id from the pod's UID, its key the pod's."""
    return JobSubmitted(job_id=job_id(pod), spec=spec, idempotency_key=pod.job_key)


def _short(reason: str) -> str:
    return reason if len(reason) <= REASON_MOST else reason[: REASON_MOST - 3] + "..."


def _all(nodes: list[str], reason: str) -> dict[str, str]:
    short = _short(reason)
    return {name: short for name in nodes}

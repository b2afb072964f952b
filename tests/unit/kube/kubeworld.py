"""A small Kubernetes cluster as gpuloom's pure `kube` package sees it: Node and Pod API
objects as the API server returns them, and a log folded in place (as a service's
follower folds it) that the extender's answers, gpuloom's own deciders and the
watcher's rounds are written to. Every event written is checked to be applied, not
voided: the fold accepting a decision is what most of these tests are about."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from typing import Any

from gpuloom.decide.admission import decide_admission
from gpuloom.decide.queueing import decide_queue
from gpuloom.events import Decision, Event, JobPlaced, JobPreempted, PolicyRef
from gpuloom.kube.extender import Reasons, filter_pod
from gpuloom.kube.nodes import KubeNode, read_node
from gpuloom.kube.pods import Pod, PodDefaults, read_pod
from gpuloom.kube.watch import KubeRound, PodsSeen, kube_round
from gpuloom.placement import BestFit, placement_cycle
from gpuloom.state import ClusterState, JobState, apply
from gpuloom.testing.builders import T0, LogBuilder

#: When the pods of these tests were made (the log starts at T0 too).
CREATED = "2025-01-01T12:00:00Z"
NAMESPACE = "team-a"


def uid_of(number: int) -> str:
    """A pod UID as the API server gives one (a UUID)."""
    return f"00000000-0000-4000-8000-{number:012x}"


def node_obj(
    name: str,
    gpus: int = 4,
    *,
    ready: bool = True,
    unschedulable: bool = False,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    capacity: str | None = None,
) -> dict[str, Any]:
    """A Node as `GET /api/v1/nodes/NAME` returns it, offering `gpus` gpuloom GPUs."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "uid": f"node-uid-{name}",
            "labels": {"kubernetes.io/hostname": name, **(labels or {})},
            "annotations": dict(annotations or {}),
        },
        "spec": {"unschedulable": True} if unschedulable else {},
        "status": {
            "capacity": {
                "cpu": "64",
                "memory": "515928Mi",
                "pods": "110",
                "gpuloom.io/gpu": capacity if capacity is not None else str(gpus),
            },
            "allocatable": {"cpu": "63500m", "gpuloom.io/gpu": str(gpus)},
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True" if ready else "False"},
            ],
        },
    }


def pod_obj(
    name: str,
    uid: str,
    gpus: int | str | None = 1,
    *,
    namespace: str = NAMESPACE,
    annotations: dict[str, str] | None = None,
    node: str = "",
    phase: str = "Pending",
    created: str = CREATED,
    owner_uid: str | None = None,
    deleting: bool = False,
    exit_codes: Sequence[int] = (),
) -> dict[str, Any]:
    """A Pod as the API returns it; `gpus` its one container's `gpuloom.io/gpu` limit
    (None: it asks for none)."""
    limits: dict[str, Any] = {"cpu": "2", "memory": "8Gi"}
    if gpus is not None:
        limits["gpuloom.io/gpu"] = str(gpus)
    meta: dict[str, Any] = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "creationTimestamp": created,
        "annotations": dict(annotations or {}),
        "labels": {"app": "train"},
    }
    if owner_uid is not None:
        meta["ownerReferences"] = [
            {"apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": owner_uid,
             "controller": True},
        ]  # fmt: skip
    if deleting:
        meta["deletionTimestamp"] = "2025-01-01T13:00:00Z"
    spec: dict[str, Any] = {
        "schedulerName": "default-scheduler",
        "containers": [{"name": "main", "image": "pytorch", "resources": {"limits": limits}}],
    }
    if node:
        spec["nodeName"] = node
    status: dict[str, Any] = {"phase": phase}
    if exit_codes:
        status["containerStatuses"] = [
            {"name": f"c{i}", "state": {"terminated": {"exitCode": code, "reason": "Completed"}}}
            for i, code in enumerate(exit_codes)
        ]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def kube_pod(name: str, uid: str, gpus: int = 1, **kw: Any) -> Pod:
    """`pod_obj` read as gpuloom reads it."""
    pod = read_pod(pod_obj(name, uid, gpus, **kw))
    assert pod is not None
    return pod


def kube_nodes(*objects: dict[str, Any]) -> dict[str, KubeNode]:
    """The watcher's view of the Nodes it listed, by gpuloom name."""
    found = {}
    for obj in objects:
        node = read_node(obj)
        assert node is not None
        found[node.name] = node
    return found


def seen(*pods: Pod, deleted: Iterable[str] = (), listed_at: datetime | None = None) -> PodsSeen:
    return PodsSeen({p.uid: p for p in pods}, frozenset(deleted), listed_at)


class World:
    """A log and its state, folded in place one event at a time (as a service's follower
    folds it: the state object stays the same)."""

    def __init__(self, defaults: PodDefaults | None = None) -> None:
        self.log = LogBuilder(start=T0)
        self.state = ClusterState()
        self.defaults = defaults or PodDefaults()
        self.reasons = Reasons()

    @property
    def now(self) -> datetime:
        return self.log.now

    def later(self, seconds: float) -> datetime:
        return self.log.now + timedelta(seconds=seconds)

    def write(self, *events: Event) -> None:
        """Append and fold `events`, each of which must be applied."""
        for event in events:
            recorded = self.log.append(event)
            folded = apply(self.state, recorded)
            assert folded.applied, f"{event.TYPE} voided: {folded.voided}"
        self.check()

    def decide(self, decisions: Iterable[Decision]) -> list[Decision]:
        decided = list(decisions)
        self.write(*(d.event for d in decided))
        return decided

    def check(self) -> None:
        assert self.state.voided == 0, self.state.recent_voided
        assert not self.state.recent_voided

    # --- what the services do ----------------------------------------------------------

    def register(self, *objects: dict[str, Any]) -> dict[str, KubeNode]:
        """The watcher registers these Nodes (its round, folded)."""
        nodes = kube_nodes(*objects)
        self.round(nodes, None)
        assert all(name in self.state.nodes for name in nodes)
        return nodes

    def round(self, nodes: dict[str, KubeNode] | None, pods: PodsSeen | None) -> KubeRound:
        """The watcher's round, its decisions folded."""
        found = kube_round(self.state, nodes, pods)
        self.decide(found.decisions)
        return found

    def submit(self, pod: Pod, nodes: Sequence[str] = ()) -> str:
        """kube-scheduler's first filter of `pod`: its job submitted, its id returned."""
        answer = filter_pod(self.state, pod, list(nodes), self.defaults, self.reasons)
        assert answer.submit is not None, answer
        self.write(answer.submit)
        return answer.submit.job_id

    def queue(self) -> None:
        """Admission and the queue answer every submitted job."""
        self.decide(decide_admission(self.state))
        self.decide(decide_queue(self.state))

    def place(self) -> list[JobPlaced]:
        """One real placement cycle, folded; the placements it made."""
        decided = self.decide(placement_cycle(self.state, BestFit()))
        return [d.event for d in decided if isinstance(d.event, JobPlaced)]

    def placed(self, pod: Pod, nodes: Sequence[str] = ()) -> JobState:
        """Submit `pod`, queue it and place it: its job."""
        job_id = self.submit(pod, nodes)
        self.queue()
        self.place()
        job = self.state.jobs[job_id]
        assert job.phase == "placed", job.phase
        return job

    def preempt(self, job: JobState, by: str) -> None:
        event = JobPreempted(
            job_id=job.job_id,
            attempt=job.attempt,
            by=by,
            reason="priority",
            basis_seq=self.state.seq,
            cycle_position=0,
            policy=PolicyRef(name="test", version=1),
        )
        self.write(event)

    def holders(self) -> dict[tuple[str, int], set[str]]:
        """Who holds each GPU that someone holds."""
        held: dict[tuple[str, int], set[str]] = {}
        for node in self.state.nodes.values():
            for index, gpu in node.gpus.items():
                if not gpu.idle:
                    held[(node.name, index)] = set(gpu.holders)
        return held

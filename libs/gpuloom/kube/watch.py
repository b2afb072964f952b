"""The Kubernetes watcher's round: the log's events and the API calls that bring gpuloom
and the cluster into agreement, as a function of the folded state and of what the
watcher last read from the API.

The watcher is, for Kubernetes nodes, what the inventory and the agents are for
gpuloom's own: it registers the Nodes that offer `gpuloom.io/gpu` (NodeRegistered),
loses the NotReady or deleted ones (NodeLost: their jobs are requeued), mirrors a
cordon, and reports each pod's job as its kubelet would: started once bound where
gpuloom placed it (JobStarted), ended with its exit code (JobFinished), cancelled when
the pod is deleted first (JobCancelRequested, or JobFinished when it was placed). Its
actions on the API: annotate a pod once it is placed (which also makes kube-scheduler
try it again at once), evict a pod gpuloom preempted or cancelled, delete one bound
where its job no longer is (a pod cannot move; its controller makes it again).

Level triggered, as every reactor: from the state and the API's current objects alone,
so a watcher restarted after any outage decides the same, and the intent keys and the
fold make a repeated decision harmless.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuloom.events import (
    Decision,
    JobCancelRequested,
    JobFinished,
    JobStarted,
    NodeCordoned,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUncordoned,
    intents,
)
from gpuloom.kube.extender import QUEUED_PREFIX, placement_annotations, replica_of
from gpuloom.kube.nodes import KubeNode, kube_name
from gpuloom.kube.pods import Pod, PodDefaults, PodProblem, job_spec
from gpuloom.kube.vocabulary import ATTEMPT, KUBE_CORDON, NUDGED, PLACED_NODE
from gpuloom.state import ClusterState, JobState, registration_conflict
from gpuloom.state.feasibility import KUBERNETES
from gpuloom.state.lifecycle import ON_NODE, PENDING

#: Who the watcher's requests say asked (`JobCancelRequested.requested_by`).
WATCHER = "kubernetes"
#: A job whose pod the watcher never saw counts as deleted only when it was submitted
#: this long before the watcher's last full list (the list may simply predate the pod).
LIST_GRACE = timedelta(seconds=5)
#: A pending pod that asks for gpuloom.io/gpu and that gpuloom has not heard of this long
#: after its creation (kube-scheduler could not reach the extender: it was down) is
#: touched once per this long, which makes kube-scheduler try it again now rather than
#: after its minute-long wait for unschedulable pods.
NUDGE_EVERY = timedelta(seconds=10)
#: A placed pod still not bound this long after its placement is touched again.
SET_ASIDE_AFTER = timedelta(seconds=20)


@dataclass(frozen=True, slots=True)
class Annotate:
    namespace: str
    name: str
    #: (name, value) pairs, in name order (an action is hashable: the service makes
    #: each one once per few seconds).
    annotations: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Evict:
    namespace: str
    name: str
    why: str


@dataclass(frozen=True, slots=True)
class Delete:
    namespace: str
    name: str
    why: str


Action = Annotate | Evict | Delete


@dataclass(frozen=True, slots=True)
class PodsSeen:
    """What the watcher read of the pods that ask for `gpuloom.io/gpu`."""

    #: Live pods by UID.
    pods: dict[str, Pod]
    #: UIDs of pods the watch saw deleted (kept while their jobs live).
    deleted: frozenset[str] = frozenset()
    #: When the watcher last listed every pod (a job submitted well before it whose pod
    #: was not in the list had its pod deleted meanwhile).
    listed_at: datetime | None = None
    #: When it looked (the edge's clock): a pod gpuloom has not heard of this long after
    #: its creation is nudged.
    now: datetime | None = None


@dataclass
class KubeRound:
    decisions: list[Decision] = field(default_factory=list)
    actions: list[Action] = field(default_factory=list)
    #: Nodes or pods skipped, with why (the service logs them).
    skipped: list[tuple[str, str]] = field(default_factory=list)
    #: Nodes not ready, or lost by this round: no replica is reported started there (the
    #: fold requeues their jobs; a start after the loss would be void).
    out: set[str] = field(default_factory=set)
    #: The watcher's clock at this round (None: no clock read: time limits wait).
    now: datetime | None = None


def kube_round(
    state: ClusterState, nodes: dict[str, KubeNode] | None, seen: PodsSeen | None
) -> KubeRound:
    """The round's decisions and actions; `nodes` or `seen` None: not listed yet (the
    watcher decides nothing about what it has not read in full)."""
    found = KubeRound(now=seen.now if seen is not None else None)
    found.out = {name for name, node in state.nodes.items() if node.phase != "ready"}
    of_nodes = KubeRound()
    if nodes is not None:
        _nodes(state, nodes, of_nodes)
        found.out |= {d.event.node for d in of_nodes.decisions if isinstance(d.event, NodeLost)}
    if seen is not None:
        _pods(state, seen, found)
    # the pods' ends before the nodes' losses: a pod that ended as its node went NotReady
    # keeps its outcome (after the loss its job is requeued, and its end would be void)
    found.decisions += of_nodes.decisions
    found.skipped += of_nodes.skipped
    found.decisions = _once(found.decisions)
    return found


def _once(decisions: list[Decision]) -> list[Decision]:
    """Each decision once (two pods of a gang may ask for one cancel), in order."""
    seen: set[str] = set()
    kept = []
    for decision in decisions:
        if decision.msg_id not in seen:
            seen.add(decision.msg_id)
            kept.append(decision)
    return kept


def _nodes(state: ClusterState, nodes: dict[str, KubeNode], found: KubeRound) -> None:
    for name in sorted(nodes):
        node = nodes[name]
        known = state.nodes.get(name)
        if node.spec is None:
            found.skipped.append((name, node.problem.reason if node.problem else "unusable"))
        elif known is None or known.spec.fingerprint != node.spec.fingerprint:
            conflict = registration_conflict(name, known, node.spec)
            if conflict is not None:
                found.skipped.append((name, conflict))
            else:
                event = NodeRegistered(node=name, spec=node.spec)
                found.decisions.append(Decision(event, intents.node_registered(name, state.seq)))
                continue
        if known is None:
            continue
        # a known node is followed even while its new spec cannot be taken: its readiness
        # and its cordon still hold for the jobs on it
        if known.phase == "lost" and node.ready:
            event_r = NodeRecovered(node=name)
            found.decisions.append(Decision(event_r, intents.node_recovered(name, state.seq)))
        elif known.phase == "ready" and not node.ready:
            lost = NodeLost(node=name, reason="Kubernetes says the node is not Ready")
            found.decisions.append(Decision(lost, intents.node_lost(name, state.seq)))
        if node.unschedulable and not known.cordoned:
            cordon = NodeCordoned(node=name, reason=KUBE_CORDON)
            found.decisions.append(Decision(cordon, intents.kube_cordoned(name, state.seq)))
        elif not node.unschedulable and known.cordoned and known.cordon_reason == KUBE_CORDON:
            lift = NodeUncordoned(node=name)
            found.decisions.append(Decision(lift, intents.kube_uncordoned(name, state.seq)))
    for name in sorted(state.nodes):
        known = state.nodes[name]
        if KUBERNETES in known.spec.runtimes and name not in nodes and known.phase == "ready":
            lost = NodeLost(node=name, reason="the node was deleted from Kubernetes")
            found.decisions.append(Decision(lost, intents.node_lost(name, state.seq)))


def _pods(state: ClusterState, seen: PodsSeen, found: KubeRound) -> None:
    by_key: dict[str, list[Pod]] = {}
    for uid in sorted(seen.pods):
        by_key.setdefault(seen.pods[uid].job_key, []).append(seen.pods[uid])
    if seen.now is not None:
        _nudge_unheard(state, by_key, seen.now, found)
    for job_id in sorted(state.jobs):
        job = state.jobs[job_id]
        source = job.spec.kubernetes
        if source is None or job.is_final or job.idempotency_key is None:
            continue
        pods = by_key.get(job.idempotency_key, [])
        if source.gang:
            _gang(state, job, pods, seen, found)
            continue
        lone = pods[0] if pods else None
        gone = lone is None and (
            source.uid in seen.deleted
            or (seen.listed_at is not None and job.submitted_at < seen.listed_at - LIST_GRACE)
        )
        if lone is not None and lone.deleting:
            gone = True
        _pod(job, lone, 0, gone, found)


def queued_mark(attempt: int) -> str:
    """The `gpuloom.io/nudged` value the watcher writes once a pod's job is queued (after
    `attempt` placements): kube-scheduler asks again, and the pod's FailedScheduling
    event then says what the queue says, not that admission is pending."""
    return f"{QUEUED_PREFIX}{attempt}"


def _nudge_unheard(
    state: ClusterState, by_key: dict[str, list[Pod]], now: datetime, found: KubeRound
) -> None:
    """Touch the pending pods gpuloom has never heard of, once per `NUDGE_EVERY`."""
    period = int(now.timestamp() // NUDGE_EVERY.total_seconds())
    for key in sorted(by_key):
        if key in state.idempotency_keys:
            continue
        for pod in by_key[key]:
            if pod.node_name or pod.deleting or pod.ended or now - pod.created < NUDGE_EVERY:
                continue
            if not pod.unschedulable:
                continue  # kube-scheduler has not tried it yet: it will, in its turn
            if pod.annotations.get(NUDGED) == str(period):
                continue
            if isinstance(job_spec(pod, PodDefaults()), PodProblem):
                continue  # the extender said why; asking again changes nothing
            found.actions.append(Annotate(pod.namespace, pod.name, ((NUDGED, str(period)),)))


def _gang(
    state: ClusterState, job: JobState, pods: list[Pod], seen: PodsSeen, found: KubeRound
) -> None:
    """Each pod of a gang as its replica (`replica_of`); all or none: a pod of the gang
    deleted while it waits cancels it, and once placed ends every replica (the other pods
    are deleted)."""
    everyone_gone = (
        not pods and seen.listed_at is not None and (job.submitted_at < seen.listed_at - LIST_GRACE)
    )
    if job.phase in PENDING:
        if everyone_gone or any(p.deleting or p.ended for p in pods):
            _cancel(job, found)
            return
        for pod in pods:
            _pod(job, pod, 0, False, found)
        return
    if job.phase not in ON_NODE:
        return
    names = [p.name for p in pods]
    by_replica: dict[int, Pod] = {}
    for pod in sorted(pods, key=lambda p: p.name):
        replica = replica_of(pod, names, len(job.replicas))
        if replica is not None and replica not in by_replica:
            by_replica[replica] = pod
    broken = any(p.deleting for p in pods)
    for replica in range(len(job.replicas)):
        member = by_replica.get(replica)
        if member is None:
            # a replica that started had its pod (the extender bound it, and wrote its
            # replica on it): with none now, it was deleted
            if replica in job.started_replicas or everyone_gone:
                broken = True
                _pod(job, None, replica, True, found)
            continue
        _pod(job, member, replica, member.deleting, found)
    if broken:
        for pod in pods:
            if not pod.deleting:
                found.actions.append(Delete(pod.namespace, pod.name, "a pod of its gang is gone"))


def _pod(job: JobState, pod: Pod | None, replica: int, gone: bool, found: KubeRound) -> None:
    """What one pod of a live job asks for."""
    if job.phase in PENDING:
        if gone or (pod is not None and pod.ended):
            _cancel(job, found)
        elif pod is not None and pod.node_name:  # bound before a requeue: it cannot move
            found.actions.append(
                Delete(pod.namespace, pod.name, f"its job {job.job_id} was requeued")
            )
        elif pod is not None and job.phase == "queued":
            mark = queued_mark(job.attempt)
            if pod.annotations.get(NUDGED) != mark:  # its reason is the queue's now
                found.actions.append(Annotate(pod.namespace, pod.name, ((NUDGED, mark),)))
        return
    if job.phase not in ON_NODE or replica >= len(job.replicas):
        return
    host = job.replicas[replica].host
    started = replica in job.started_replicas
    if replica in job.finished_replicas or replica in job.left:
        return
    elsewhere = pod is not None and pod.node_name and pod.node_name != kube_name(host)
    if gone or (pod is not None and pod.ended) or elsewhere:
        _finish(job, pod, replica, host, found)
        return
    assert pod is not None
    stop = _stop_reason(job, found.now)
    bound_for = pod.annotations.get(ATTEMPT, str(job.attempt))
    if not started and pod.node_name == kube_name(host) and bound_for != str(job.attempt):
        # bound for an earlier placement of the job: it holds that one's GPUs
        why = f"it is bound for placement {bound_for}, not {job.attempt}"
        found.actions.append(Delete(pod.namespace, pod.name, why))
        return
    if started or pod.node_name == kube_name(host):
        if not started and host not in found.out:
            event = JobStarted(job_id=job.job_id, attempt=job.attempt, node=host, replica=replica)
            found.decisions.append(
                Decision(event, intents.started(job.job_id, job.attempt, replica))
            )
        if stop is not None:
            found.actions.append(Evict(pod.namespace, pod.name, stop))
    elif stop is not None:  # not bound yet: it leaves the node without a pod to stop
        _finish(job, pod, replica, host, found, unbound=True)
    elif pod.annotations.get(PLACED_NODE) != kube_name(host) or pod.annotations.get(ATTEMPT) != str(
        job.attempt
    ):
        notes = tuple(sorted(placement_annotations(job, replica).items()))
        found.actions.append(Annotate(pod.namespace, pod.name, notes))
    elif pod.unschedulable and found.now is not None and job.placed_at is not None:
        # annotated, yet still not bound well after (a bind that timed out, an attempt
        # that raced the annotation): touched once per SET_ASIDE_AFTER, rather than left
        # to kube-scheduler's flush of pods unschedulable for a minute. Not sooner: a pod
        # merely waiting its turn in a long queue would only cost the API a write
        period = int(found.now.timestamp() // SET_ASIDE_AFTER.total_seconds())
        waited = found.now - job.placed_at >= SET_ASIDE_AFTER
        if waited and pod.annotations.get(NUDGED) != str(period):
            found.actions.append(Annotate(pod.namespace, pod.name, ((NUDGED, str(period)),)))


def _timed_out(job: JobState, now: datetime | None) -> bool:
    """The job ran past its time limit (`gpuloom.io/time-limit`): its pod is evicted, as
    an agent stops a process, and the job ends `timed_out`."""
    limit, since = job.spec.time_limit_s, job.started_at
    return (
        limit is not None
        and since is not None
        and now is not None
        and (now - since > timedelta(seconds=limit))
    )


def _stop_reason(job: JobState, now: datetime | None) -> str | None:
    if _timed_out(job, now):
        return f"its time limit of {job.spec.time_limit_s} s passed"
    if job.preempted_by is not None:
        return f"preempted by gpuloom job {job.preempted_by}"
    if job.health_stop is not None:
        return f"a GPU under it failed: {job.health_stop}"
    if job.cancel_requested:
        return "cancelled in gpuloom"
    if job.shrink_by is not None:
        return f"its gang shrinks for gpuloom job {job.shrink_by}"
    return None


def _finish(
    job: JobState,
    pod: Pod | None,
    replica: int,
    host: str,
    found: KubeRound,
    *,
    unbound: bool = False,
) -> None:
    """The replica's end: the pod's own, or its deletion; `unbound`: gpuloom stops a
    replica whose pod was never bound (preempted, a GPU failed: it is requeued, and the
    pod, still pending, is placed again; cancelled: it ends)."""
    if unbound:
        stop = _stop_reason(job, found.now)
        outcome = "cancelled" if job.cancel_requested else "preempted"
        event = JobFinished(
            job_id=job.job_id,
            attempt=job.attempt,
            node=host,
            replica=replica,
            outcome=outcome,
            reason=f"stopped before its pod was bound: {stop}",
        )
        found.decisions.append(Decision(event, intents.finished(job.job_id, job.attempt, replica)))
        return
    if pod is not None and pod.ended and not pod.deleting:
        outcome = "succeeded" if pod.phase == "Succeeded" else "failed"
        reason = None if outcome == "succeeded" else "the pod failed"
        code = pod.exit_code if pod.exit_code is not None else (0 if outcome == "succeeded" else 1)
    else:
        stop = _stop_reason(job, found.now)
        outcome = "timed_out" if _timed_out(job, found.now) else "cancelled"
        code = None
        reason = f"the pod was deleted ({stop})" if stop else "the pod was deleted"
        if pod is not None and pod.node_name and pod.node_name != kube_name(host):
            reason = f"the pod is bound to {pod.node_name}, not where gpuloom placed it"
    event = JobFinished(
        job_id=job.job_id,
        attempt=job.attempt,
        node=host,
        replica=replica,
        outcome=outcome,
        exit_code=code,
        reason=reason,
    )
    found.decisions.append(Decision(event, intents.finished(job.job_id, job.attempt, replica)))


def _cancel(job: JobState, found: KubeRound) -> None:
    if job.cancel_requested:
        return
    event = JobCancelRequested(job_id=job.job_id, requested_by=WATCHER)
    found.decisions.append(Decision(event, intents.cancel_requested(job.job_id)))

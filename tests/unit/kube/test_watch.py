"""The Kubernetes watcher's round (`kube_round`): the events and API actions that bring
gpuloom and the cluster into agreement. Every decision a round makes is folded (the
`World` checks the fold applied it, voided nothing), and a round on the folded state
proposes nothing more: the watcher is level triggered and idempotent."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import pytest

from gpuloom.events import (
    GpuUnhealthy,
    JobCancelRequested,
    JobFinished,
    JobPlaced,
    JobStarted,
    NodeCordoned,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeUncordoned,
    PolicyRef,
    intents,
)
from gpuloom.events.base import Event
from gpuloom.kube.extender import placement_annotations
from gpuloom.kube.nodes import KubeNode
from gpuloom.kube.pods import Pod, job_id
from gpuloom.kube.vocabulary import (
    ATTEMPT,
    GANG,
    GPU_MILLI,
    KUBE_CORDON,
    NUDGED,
    PLACED_GPUS,
    PLACED_NODE,
    REPLICAS,
    TIME_LIMIT,
)
from gpuloom.kube.watch import (
    LIST_GRACE,
    NUDGE_EVERY,
    WATCHER,
    Annotate,
    Delete,
    Evict,
    KubeRound,
    PodsSeen,
    kube_round,
    queued_mark,
)
from gpuloom.state import JobState, apply
from gpuloom.testing.builders import make_node

from .kubeworld import World, kube_nodes, kube_pod, node_obj, seen, uid_of

A, B = "node-a.example", "node-b"
GA, GB = "node-a_example", "node-b"


def events(found: KubeRound) -> list[Event]:
    return [d.event for d in found.decisions]


def quiet(w: World, nodes: dict[str, KubeNode] | None, pods: PodsSeen | None) -> None:
    """The next round, on the state its decisions were folded into, proposes nothing."""
    again = kube_round(w.state, nodes, pods)
    assert again.decisions == [], events(again)


def two_nodes(**kw: Any) -> tuple[World, dict[str, KubeNode]]:
    w = World()
    nodes = w.register(node_obj(A, 2, **kw), node_obj(B, 2, **kw))
    return w, nodes


def bound(pod: Pod, node: str, **kw: Any) -> Pod:
    """`pod` once kube-scheduler bound it to `node` (and the pod changed as told)."""
    kw.setdefault("owner_uid", pod.owner_uid or None)
    return kube_pod(pod.name, pod.uid, pod.gpus, annotations=pod.annotations, node=node, **kw)


def phase_of(w: World, job: str) -> str:
    """The job's phase, also once it ended and left the state."""
    if job in w.state.jobs:
        return w.state.jobs[job].phase
    return w.state.tombstones[job].phase


def running(w: World, nodes: dict[str, KubeNode], gpus: int = 1) -> tuple[Pod, JobState]:
    """A pod placed, bound where placed and started by the watcher."""
    pod = kube_pod("train-0", uid_of(1), gpus)
    job = w.placed(pod, [A, B])
    host = job.replicas[0].host.replace("_", ".")
    on_node = bound(pod, host)
    found = w.round(nodes, seen(on_node))
    assert [type(e) for e in events(found)] == [JobStarted]
    assert w.state.jobs[job.job_id].phase == "running"
    return on_node, w.state.jobs[job.job_id]


def host_of(job: JobState) -> str:
    return job.replicas[0].host.replace("_", ".")


# --- nodes ------------------------------------------------------------------------------


def test_nothing_listed_nothing_decided() -> None:
    w, _nodes = two_nodes()
    pod = kube_pod("p", uid_of(1))
    w.placed(pod, [A, B])
    found = kube_round(w.state, None, None)
    assert found == KubeRound()


def test_a_new_node_is_registered_once() -> None:
    w = World()
    nodes = kube_nodes(node_obj(A, 4))
    found = w.round(nodes, None)
    [event] = events(found)
    assert isinstance(event, NodeRegistered) and event.node == GA
    assert event.spec.runtimes == ["kubernetes"] and len(event.spec.gpus) == 4
    assert found.decisions[0].msg_id == intents.node_registered(GA, 0)
    assert w.state.nodes[GA].phase == "ready"
    quiet(w, nodes, None)


def test_a_node_whose_labels_changed_is_registered_again() -> None:
    w, _ = two_nodes()
    nodes = kube_nodes(node_obj(A, 2, labels={"gpuloom.io/model": "H100"}), node_obj(B, 2))
    [event] = events(w.round(nodes, None))
    assert isinstance(event, NodeRegistered) and event.node == GA
    assert {g.model for g in w.state.nodes[GA].gpus.values()} == {"H100"}
    quiet(w, nodes, None)


def test_a_registration_that_would_pull_a_held_gpu_from_under_a_job_is_skipped() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 2)
    job = w.placed(pod, [A, B])
    host = job.replicas[0].host
    kube_host = host.replace("_", ".")
    uuids = {"gpuloom.io/gpu-uuids": "GPU-x0,GPU-x1"}
    changed = {**nodes, **kube_nodes(node_obj(kube_host, 2, annotations=uuids))}
    found = w.round(changed, None)
    assert found.decisions == []
    assert [name for name, _ in found.skipped] == [host]
    assert job.job_id in found.skipped[0][1]


def test_a_node_gpuloom_cannot_read_is_skipped_with_why() -> None:
    w = World()
    nodes = kube_nodes(node_obj(A, 2, labels={"gpuloom.io/pool": "shared"}))
    found = w.round(nodes, None)
    assert found.decisions == [] and found.skipped[0][0] == GA
    assert "gpuloom.io/pool" in found.skipped[0][1]


def test_a_node_not_ready_is_lost_and_comes_back_when_ready() -> None:
    w, nodes = two_nodes()
    down = {**nodes, **kube_nodes(node_obj(A, 2, ready=False))}
    [lost] = events(w.round(down, None))
    assert isinstance(lost, NodeLost) and lost.node == GA and "not Ready" in lost.reason
    assert w.state.nodes[GA].phase == "lost"
    quiet(w, down, None)
    [back] = events(w.round(nodes, None))
    assert isinstance(back, NodeRecovered) and back.node == GA
    assert w.state.nodes[GA].phase == "ready"
    quiet(w, nodes, None)


def test_a_new_node_that_is_not_ready_is_registered_then_lost() -> None:
    w = World()
    nodes = kube_nodes(node_obj(A, 2, ready=False))
    assert [type(e) for e in events(w.round(nodes, None))] == [NodeRegistered]
    assert [type(e) for e in events(w.round(nodes, None))] == [NodeLost]
    quiet(w, nodes, None)


def test_a_node_marked_unschedulable_is_cordoned_by_the_watcher_and_uncordoned_with_it() -> None:
    w, nodes = two_nodes()
    cordoned = {**nodes, **kube_nodes(node_obj(B, 2, unschedulable=True))}
    [event] = events(w.round(cordoned, None))
    assert isinstance(event, NodeCordoned) and event.node == GB and event.reason == KUBE_CORDON
    assert w.state.nodes[GB].cordoned and w.state.nodes[GB].cordon_reason == KUBE_CORDON
    quiet(w, cordoned, None)
    [lift] = events(w.round(nodes, None))
    assert isinstance(lift, NodeUncordoned) and lift.node == GB
    assert not w.state.nodes[GB].cordoned
    quiet(w, nodes, None)


def test_an_operator_s_cordon_stays_when_kubernetes_says_schedulable() -> None:
    w, nodes = two_nodes()
    w.write(NodeCordoned(node=GB, reason="maintenance: new firmware"))
    quiet(w, nodes, None)
    assert w.state.nodes[GB].cordoned
    # and an operator's cordon is not taken over by Kubernetes' one
    cordoned = {**nodes, **kube_nodes(node_obj(B, 2, unschedulable=True))}
    quiet(w, cordoned, None)
    assert w.state.nodes[GB].cordon_reason == "maintenance: new firmware"


def test_a_node_lost_and_unschedulable_at_once_is_lost_and_cordoned() -> None:
    w, nodes = two_nodes()
    both = {**nodes, **kube_nodes(node_obj(A, 2, ready=False, unschedulable=True))}
    assert sorted(type(e).__name__ for e in events(w.round(both, None))) == [
        "NodeCordoned",
        "NodeLost",
    ]
    quiet(w, both, None)


def test_a_kubernetes_node_gone_from_the_api_is_lost() -> None:
    w, nodes = two_nodes()
    left = {GB: nodes[GB]}
    [event] = events(w.round(left, None))
    assert isinstance(event, NodeLost) and event.node == GA and "deleted" in event.reason
    quiet(w, left, None)


def test_a_node_of_gpuloom_s_own_agents_is_not_the_watcher_s() -> None:
    w, nodes = two_nodes()
    w.write(make_node("agent-node", 4))
    quiet(w, nodes, None)
    assert w.state.nodes["agent-node"].phase == "ready"


def test_the_jobs_of_a_node_gone_not_ready_are_requeued() -> None:
    w, nodes = two_nodes()
    pod, job = running(w, nodes)
    down = {**nodes, **kube_nodes(node_obj(host_of(job), 2, ready=False))}
    w.round(down, seen(pod))
    assert w.state.jobs[job.job_id].phase == "queued"
    # its pod cannot move: it is deleted (its controller makes it again)
    found = w.round(down, seen(pod))
    assert found.decisions == []
    assert found.actions == [Delete(pod.namespace, pod.name, f"its job {job.job_id} was requeued")]


# --- pods: placed, bound, started -------------------------------------------------------


def test_a_placed_pod_not_bound_is_annotated_until_it_carries_the_annotations() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 2)
    job = w.placed(pod, [A, B])
    found = w.round(nodes, seen(pod))
    assert found.decisions == []
    notes = placement_annotations(w.state.jobs[job.job_id], 0)
    assert found.actions == [Annotate(pod.namespace, pod.name, tuple(sorted(notes.items())))]
    assert notes[PLACED_NODE] == host_of(job) and notes[ATTEMPT] == "1"
    annotated = kube_pod(pod.name, pod.uid, 2, annotations=notes)
    again = w.round(nodes, seen(annotated))
    assert again.decisions == [] and again.actions == []


def test_a_pod_annotated_for_an_earlier_attempt_is_annotated_again() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 2)
    job = w.placed(pod, [A, B])
    stale = placement_annotations(w.state.jobs[job.job_id], 0) | {ATTEMPT: "0"}
    found = w.round(nodes, seen(kube_pod(pod.name, pod.uid, 2, annotations=stale)))
    assert [type(a) for a in found.actions] == [Annotate]


def test_a_pod_bound_where_it_was_placed_starts_its_job() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A, B])
    on_node = bound(pod, host_of(job))
    found = w.round(nodes, seen(on_node))
    [started] = events(found)
    assert isinstance(started, JobStarted)
    assert (started.job_id, started.attempt, started.node, started.replica) == (
        job.job_id,
        1,
        job.replicas[0].host,
        0,
    )
    assert found.decisions[0].msg_id == intents.started(job.job_id, 1, 0)
    assert found.actions == []
    assert w.state.jobs[job.job_id].phase == "running"
    quiet(w, nodes, seen(on_node))
    assert kube_round(w.state, nodes, seen(on_node)).actions == []


def test_a_job_not_from_kubernetes_is_not_the_watcher_s() -> None:
    w, nodes = two_nodes()
    apply(w.state, w.log.submit("gateway-job", gpus=1))
    w.check()
    found = w.round(nodes, seen(listed_at=w.later(3600)))
    assert found.decisions == [] and found.actions == []


# --- pods: ended ------------------------------------------------------------------------


def test_a_pod_that_succeeded_finishes_its_job_with_its_exit_code() -> None:
    w, nodes = two_nodes()
    pod, job = running(w, nodes)
    done = bound(pod, pod.node_name, phase="Succeeded", exit_codes=[0, 0])
    [finished] = events(w.round(nodes, seen(done)))
    assert isinstance(finished, JobFinished)
    assert (finished.outcome, finished.exit_code, finished.reason) == ("succeeded", 0, None)
    assert phase_of(w, job.job_id) == "succeeded"
    quiet(w, nodes, seen(done))
    assert w.holders() == {}


def test_a_pod_that_failed_fails_its_job_with_its_exit_code() -> None:
    w, nodes = two_nodes()
    pod, job = running(w, nodes)
    failed = bound(pod, pod.node_name, phase="Failed", exit_codes=[0, 137])
    [finished] = events(w.round(nodes, seen(failed)))
    assert isinstance(finished, JobFinished)
    assert (finished.outcome, finished.exit_code) == ("failed", 137)
    assert finished.reason == "the pod failed"
    assert phase_of(w, job.job_id) == "failed"
    quiet(w, nodes, seen(failed))


def test_a_pod_that_failed_without_an_exit_code_fails_with_one() -> None:
    w, nodes = two_nodes()
    pod, _ = running(w, nodes)
    [finished] = events(w.round(nodes, seen(bound(pod, pod.node_name, phase="Failed"))))
    assert isinstance(finished, JobFinished) and (finished.outcome, finished.exit_code) == (
        "failed",
        1,
    )


def test_a_pod_that_ended_before_its_job_started_finishes_it() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A, B])
    done = bound(pod, host_of(job), phase="Succeeded", exit_codes=[0])
    [finished] = events(w.round(nodes, seen(done)))
    assert isinstance(finished, JobFinished) and finished.outcome == "succeeded"
    assert w.holders() == {}


# --- pods: deleted ----------------------------------------------------------------------


def queued(w: World) -> tuple[Pod, str]:
    pod = kube_pod("p", uid_of(1), 8)  # more than a node has: it waits
    job = w.submit(pod, [A, B])
    w.queue()
    w.place()
    assert w.state.jobs[job].phase == "queued"
    return pod, job


def test_a_queued_job_whose_pod_was_deleted_is_cancelled() -> None:
    w, nodes = two_nodes()
    pod, job = queued(w)
    found = w.round(nodes, seen(deleted=[pod.uid], listed_at=w.now))
    [event] = events(found)
    assert isinstance(event, JobCancelRequested) and event.requested_by == WATCHER
    assert found.decisions[0].msg_id == intents.cancel_requested(job)
    assert w.state.jobs[job].cancel_requested
    quiet(w, nodes, seen(deleted=[pod.uid], listed_at=w.now))
    w.queue()  # the queue carries the request out
    assert phase_of(w, job) == "cancelled"
    quiet(w, nodes, seen(deleted=[pod.uid], listed_at=w.now))


def test_a_queued_job_whose_pod_is_being_deleted_is_cancelled() -> None:
    w, nodes = two_nodes()
    pod, _job = queued(w)
    deleting = kube_pod(pod.name, pod.uid, pod.gpus, deleting=True)
    assert [type(e) for e in events(w.round(nodes, seen(deleting)))] == [JobCancelRequested]


def test_a_job_whose_pod_is_missing_from_a_later_list_is_cancelled() -> None:
    w, nodes = two_nodes()
    _, job = queued(w)
    submitted = w.state.jobs[job].submitted_at
    too_soon = seen(listed_at=submitted + LIST_GRACE)
    assert kube_round(w.state, nodes, too_soon).decisions == [], "the list may predate the pod"
    assert kube_round(w.state, nodes, seen()).decisions == [], "never listed: nothing known"
    later = seen(listed_at=submitted + LIST_GRACE + LIST_GRACE)
    assert [type(e) for e in events(w.round(nodes, later))] == [JobCancelRequested]
    quiet(w, nodes, later)


def test_a_running_job_whose_pod_was_deleted_finishes_cancelled() -> None:
    w, nodes = two_nodes()
    pod, job = running(w, nodes)
    found = w.round(nodes, seen(deleted=[pod.uid], listed_at=w.now))
    [finished] = events(found)
    assert isinstance(finished, JobFinished) and finished.outcome == "cancelled"
    assert finished.reason == "the pod was deleted" and finished.exit_code is None
    assert finished.node == job.replicas[0].host
    assert phase_of(w, job.job_id) == "cancelled"
    assert w.holders() == {}
    quiet(w, nodes, seen(deleted=[pod.uid], listed_at=w.now))


def test_a_running_pod_being_deleted_finishes_its_job_cancelled() -> None:
    w, nodes = two_nodes()
    pod, _job = running(w, nodes)
    deleting = bound(pod, pod.node_name, deleting=True, phase="Running")
    [finished] = events(w.round(nodes, seen(deleting)))
    assert isinstance(finished, JobFinished) and finished.outcome == "cancelled"


def test_a_placed_job_whose_pod_was_deleted_before_binding_finishes_cancelled() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A, B])
    [finished] = events(w.round(nodes, seen(deleted=[pod.uid])))
    assert isinstance(finished, JobFinished) and finished.outcome == "cancelled"
    assert phase_of(w, job.job_id) == "cancelled" and w.holders() == {}


# --- pods: preempted, cancelled, stopped ------------------------------------------------


def other_job(w: World) -> str:
    """A job that preempts (any job the state holds)."""
    pod = kube_pod("urgent", uid_of(77), 1)
    return w.submit(pod, [A, B])


def test_a_preempted_pod_that_is_bound_is_evicted() -> None:
    w, nodes = two_nodes()
    pod, job = running(w, nodes)
    by = other_job(w)
    w.preempt(job, by)
    found = w.round(nodes, seen(pod))
    assert found.decisions == []
    assert found.actions == [Evict(pod.namespace, pod.name, f"preempted by gpuloom job {by}")]
    # once evicted (being deleted), its replica ends and its GPUs are free
    evicted = bound(pod, pod.node_name, deleting=True, phase="Running")
    [finished] = events(w.round(nodes, seen(evicted)))
    assert isinstance(finished, JobFinished) and f"preempted by gpuloom job {by}" in (
        finished.reason or ""
    )
    assert job.job_id not in w.state.on_node.get(job.replicas[0].host, set())
    assert all(job.job_id not in holders for holders in w.holders().values())
    quiet(w, nodes, seen(evicted))


def test_a_preempted_pod_bound_before_its_start_was_heard_starts_and_is_evicted() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A, B])
    w.preempt(job, other_job(w))
    found = w.round(nodes, seen(bound(pod, host_of(job))))
    assert [type(e) for e in events(found)] == [JobStarted]
    assert [type(a) for a in found.actions] == [Evict]


def test_a_preempted_pod_not_bound_yet_is_requeued() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A, B])
    by = other_job(w)
    w.preempt(job, by)
    found = w.round(nodes, seen(pod))
    [finished] = events(found)
    assert isinstance(finished, JobFinished) and finished.outcome == "preempted"
    assert finished.reason == f"stopped before its pod was bound: preempted by gpuloom job {by}"
    assert found.actions == []
    requeued = w.state.jobs[job.job_id]
    assert requeued.phase == "queued" and requeued.yields_to == by
    assert w.holders() == {}
    # the pod, still pending, is touched so that kube-scheduler hears the queue's reason
    again = w.round(nodes, seen(pod))
    assert again.decisions == []
    assert again.actions == [Annotate(pod.namespace, pod.name, ((NUDGED, queued_mark(1)),))]
    marked = kube_pod(pod.name, pod.uid, 1, annotations={**pod.annotations, NUDGED: "queued-1"})
    assert kube_round(w.state, nodes, seen(marked)) == KubeRound()


def test_a_pod_not_bound_whose_gpu_failed_is_requeued_first() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A, B])
    piece = job.replicas[0].slices[0]
    w.write(
        GpuUnhealthy(
            node=piece.node, index=piece.index, uuid=piece.uuid, check="xid", evidence="Xid 79"
        )
    )
    assert w.state.jobs[job.job_id].health_stop is not None
    [finished] = events(w.round(nodes, seen(pod)))
    assert isinstance(finished, JobFinished) and finished.outcome == "preempted"
    assert w.state.jobs[job.job_id].phase == "queued" and w.state.jobs[job.job_id].expedited


def test_a_running_pod_cancelled_in_gpuloom_is_evicted_then_its_job_ends() -> None:
    w, nodes = two_nodes()
    pod, job = running(w, nodes)
    w.write(JobCancelRequested(job_id=job.job_id, requested_by="alice"))
    found = w.round(nodes, seen(pod))
    assert found.decisions == []
    assert found.actions == [Evict(pod.namespace, pod.name, "cancelled in gpuloom")]
    [finished] = events(w.round(nodes, seen(deleted=[pod.uid])))
    assert isinstance(finished, JobFinished) and finished.outcome == "cancelled"
    assert phase_of(w, job.job_id) == "cancelled"


def test_a_placed_pod_cancelled_in_gpuloom_before_binding_ends_cancelled() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A, B])
    w.write(JobCancelRequested(job_id=job.job_id, requested_by="alice"))
    [finished] = events(w.round(nodes, seen(pod)))
    assert isinstance(finished, JobFinished) and finished.outcome == "cancelled"
    assert phase_of(w, job.job_id) == "cancelled"


# --- pods: bound elsewhere ----------------------------------------------------------------


def test_a_pod_bound_elsewhere_while_its_job_is_queued_is_deleted() -> None:
    w, nodes = two_nodes()
    pod, job = queued(w)
    stray = bound(pod, A)
    found = w.round(nodes, seen(stray))
    assert found.decisions == []
    assert found.actions == [Delete(pod.namespace, pod.name, f"its job {job} was requeued")]


def test_a_pod_bound_to_another_node_than_its_placement_ends_its_job() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A, B])
    other = A if host_of(job) == B else B
    [finished] = events(w.round(nodes, seen(bound(pod, other))))
    assert isinstance(finished, JobFinished) and finished.outcome == "cancelled"
    assert finished.reason == f"the pod is bound to {other}, not where gpuloom placed it"


# --- gangs --------------------------------------------------------------------------------


def gang_pods(count: int = 2, owner: str = "jobset-1") -> list[Pod]:
    return [
        kube_pod(
            f"trainer-{i}",
            uid_of(100 + i),
            1,
            annotations={GANG: "trainer", REPLICAS: str(count)},
            owner_uid=owner,
        )
        for i in range(count)
    ]


def placed_gang() -> tuple[World, dict[str, KubeNode], list[Pod], JobState]:
    """A gang of two one-GPU pods placed over two one-GPU nodes."""
    w = World()
    nodes = w.register(node_obj(A, 1), node_obj(B, 1))
    pods = gang_pods()
    job = w.placed(pods[0], [A, B])
    assert len(job.replicas) == 2
    return w, nodes, pods, job


def running_gang() -> tuple[World, dict[str, KubeNode], list[Pod], JobState]:
    w, nodes, pods, job = placed_gang()
    on_nodes = [bound(p, r.host.replace("_", ".")) for p, r in zip(pods, job.replicas, strict=True)]
    found = w.round(nodes, seen(*on_nodes))
    started = [e for e in events(found) if isinstance(e, JobStarted)]
    assert sorted(e.replica for e in started) == [0, 1]
    assert w.state.jobs[job.job_id].phase == "running"
    quiet(w, nodes, seen(*on_nodes))
    return w, nodes, on_nodes, w.state.jobs[job.job_id]


def test_each_pod_of_a_placed_gang_is_annotated_for_its_own_replica() -> None:
    w, nodes, pods, job = placed_gang()
    found = w.round(nodes, seen(*pods))
    assert found.decisions == []
    by_pod = {a.name: dict(a.annotations) for a in found.actions if isinstance(a, Annotate)}
    assert by_pod == {
        "trainer-0": placement_annotations(job, 0),
        "trainer-1": placement_annotations(job, 1),
    }


def test_a_gang_whose_pods_are_all_bound_starts_each_replica() -> None:
    running_gang()


def test_a_gang_whose_pods_all_succeeded_succeeds() -> None:
    w, nodes, pods, job = running_gang()
    done = [bound(p, p.node_name, phase="Succeeded", exit_codes=[0]) for p in pods]
    found = w.round(nodes, seen(*done))
    assert [type(e) for e in events(found)] == [JobFinished, JobFinished]
    assert phase_of(w, job.job_id) == "succeeded" and w.holders() == {}


def test_a_pending_gang_one_of_whose_pods_is_deleted_is_cancelled() -> None:
    w = World()
    nodes = w.register(node_obj(A, 1))
    pods = gang_pods()
    job = w.submit(pods[0], [A])
    w.queue()
    deleting = bound(pods[1], "", deleting=True)
    found = w.round(nodes, seen(pods[0], deleting))
    assert {type(e) for e in events(found)} == {JobCancelRequested}
    assert w.state.jobs[job].cancel_requested
    quiet(w, nodes, seen(pods[0], deleting))


def test_a_round_proposes_each_decision_once() -> None:
    w = World()
    nodes = w.register(node_obj(A, 1))
    pods = gang_pods()
    w.submit(pods[0], [A])
    w.queue()
    found = kube_round(w.state, nodes, seen(pods[0], bound(pods[1], "", deleting=True)))
    keys = [d.msg_id for d in found.decisions]
    assert len(keys) == len(set(keys)), keys


def test_a_running_gang_one_of_whose_pods_is_deleted_stops_the_others() -> None:
    w, nodes, pods, _job = running_gang()
    deleting = bound(pods[0], pods[0].node_name, deleting=True)
    found = w.round(nodes, seen(deleting, pods[1]))
    [finished] = events(found)
    assert isinstance(finished, JobFinished) and finished.replica == 0
    assert finished.outcome == "cancelled"
    assert found.actions == [Delete(pods[1].namespace, pods[1].name, "a pod of its gang is gone")]


def test_a_gang_placed_before_all_its_pods_exist_waits_for_them() -> None:
    w, nodes, pods, _ = placed_gang()
    found = w.round(nodes, seen(pods[0]))
    assert not any(isinstance(a, Delete) for a in found.actions), found.actions


def test_a_gang_pod_is_annotated_for_its_own_replica_whoever_else_exists() -> None:
    w, nodes, pods, job = placed_gang()
    found = w.round(nodes, seen(pods[1]))
    for action in found.actions:
        if isinstance(action, Annotate):
            assert dict(action.annotations) == placement_annotations(job, 1)


def test_a_running_gang_whose_pods_were_all_deleted_ends() -> None:
    w, nodes, pods, job = running_gang()
    # trainer-0 is deleted; the watcher stops trainer-1 (Delete), which then goes too
    w.round(nodes, seen(bound(pods[0], pods[0].node_name, deleting=True), pods[1]))
    w.round(nodes, seen(bound(pods[1], pods[1].node_name, deleting=True)))
    gone = seen(deleted=[p.uid for p in pods], listed_at=w.later(60))
    for _ in range(3):
        w.round(nodes, gone)
    assert phase_of(w, job.job_id) == "cancelled"  # ended (accounting charges it next)
    assert w.holders() == {}


def test_a_lone_pod_s_job_id_is_the_one_its_round_names() -> None:
    w, _nodes = two_nodes()
    pod = kube_pod("p", uid_of(5), 1)
    job = w.placed(pod, [A, B])
    assert job.job_id == job_id(pod) and job.idempotency_key == pod.job_key


def fold_round(w: World, nodes: dict[str, KubeNode], pods: PodsSeen) -> list[str | None]:
    """The round's decisions folded as the log would take them: what each became."""
    outcomes = []
    for decision in kube_round(w.state, nodes, pods).decisions:
        folded = apply(w.state, w.log.append(decision.event))
        outcomes.append(None if folded.voided is None else folded.voided.reason)
    return outcomes


def test_a_pod_that_ended_as_its_node_went_not_ready_keeps_its_outcome() -> None:
    w, nodes = two_nodes()
    pod, job = running(w, nodes)
    done = bound(pod, pod.node_name, phase="Succeeded", exit_codes=[0])
    down = {**nodes, **kube_nodes(node_obj(pod.node_name, 2, ready=False))}
    voided = [why for why in fold_round(w, down, seen(done)) if why is not None]
    voided += [why for why in fold_round(w, down, seen(done)) if why is not None]
    assert voided == []
    assert phase_of(w, job.job_id) == "succeeded"


def test_a_pod_deleted_as_its_node_went_not_ready_is_not_reported_in_vain() -> None:
    w, nodes = two_nodes()
    pod, _job = running(w, nodes)
    down = {**nodes, **kube_nodes(node_obj(pod.node_name, 2, ready=False))}
    assert [why for why in fold_round(w, down, seen(deleted=[pod.uid])) if why] == []


# --- nudges: kube-scheduler asked again ---------------------------------------------------


def test_a_pod_not_bound_whose_job_is_queued_is_marked_once_per_attempt() -> None:
    w, nodes = two_nodes()
    pod, _job = queued(w)
    mark = ((NUDGED, queued_mark(0)),)
    found = w.round(nodes, seen(pod))
    assert found.decisions == [] and found.actions == [Annotate(pod.namespace, pod.name, mark)]
    marked = kube_pod(pod.name, pod.uid, pod.gpus, annotations={NUDGED: queued_mark(0)})
    assert kube_round(w.state, nodes, seen(marked)) == KubeRound()


def unheard(created_ago: float, **kw: Any) -> tuple[World, dict[str, KubeNode], Pod, datetime]:
    """A pod gpuloom never heard of (the extender was away), `created_ago` s before now."""
    w, nodes = two_nodes()
    pod = replace(kube_pod("p", uid_of(1), 1, **kw), unschedulable=True)  # kube-scheduler tried it
    now = pod.created + timedelta(seconds=created_ago)
    return w, nodes, pod, now


def test_a_pod_gpuloom_never_heard_of_is_nudged_once_per_period() -> None:
    w, nodes, pod, now = unheard(25)
    period = str(int(now.timestamp() // NUDGE_EVERY.total_seconds()))
    found = kube_round(w.state, nodes, PodsSeen({pod.uid: pod}, now=now))
    assert found.decisions == []
    assert found.actions == [Annotate(pod.namespace, pod.name, ((NUDGED, period),))]
    nudged = replace(pod, annotations={NUDGED: period})
    assert kube_round(w.state, nodes, PodsSeen({pod.uid: nudged}, now=now)).actions == []
    later = now + NUDGE_EVERY
    assert len(kube_round(w.state, nodes, PodsSeen({pod.uid: nudged}, now=later)).actions) == 1


@pytest.mark.parametrize(
    ("ago", "kw"),
    [
        (5, {}),
        (60, {"node": A}),
        (60, {"deleting": True}),
        (60, {"phase": "Failed"}),
        (60, {"annotations": {GPU_MILLI: "2000"}}),
    ],
)
def test_a_pod_that_is_new_bound_going_ended_or_refused_is_not_nudged(
    ago: float, kw: dict[str, Any]
) -> None:
    w, nodes, pod, now = unheard(ago, **kw)
    assert kube_round(w.state, nodes, PodsSeen({pod.uid: pod}, now=now)).actions == []


def test_a_pod_kube_scheduler_has_not_tried_yet_is_not_nudged() -> None:
    """It waits its turn in kube-scheduler's queue: touching it would only add work."""
    w, nodes, pod, now = unheard(60)
    untried = replace(pod, unschedulable=False)
    assert kube_round(w.state, nodes, PodsSeen({pod.uid: untried}, now=now)).actions == []


def test_a_pod_gpuloom_knows_is_not_nudged_as_unheard() -> None:
    w, nodes, pod, now = unheard(60)
    job = w.placed(pod, [A, B])
    found = kube_round(w.state, nodes, PodsSeen({pod.uid: pod}, now=now))
    notes = [dict(a.annotations) for a in found.actions if isinstance(a, Annotate)]
    assert [n.get(PLACED_NODE) for n in notes] == [host_of(job)] and len(found.actions) == 1


def test_without_the_time_nothing_is_nudged() -> None:
    w, nodes, pod, _ = unheard(3600)
    assert kube_round(w.state, nodes, seen(pod)).actions == []


# --- a node lost in the round ---------------------------------------------------------------


def test_a_pod_bound_on_a_node_lost_in_the_same_round_is_not_started() -> None:
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A, B])
    on_node = bound(pod, host_of(job))
    down = {**nodes, **kube_nodes(node_obj(host_of(job), 2, ready=False))}
    found = w.round(down, seen(on_node))
    assert [type(e) for e in events(found)] == [NodeLost]
    assert w.state.jobs[job.job_id].phase == "queued"
    again = w.round(down, seen(on_node))
    assert again.decisions == [] and [type(a) for a in again.actions] == [Delete]


def test_a_pod_bound_for_an_earlier_attempt_does_not_start_the_next() -> None:
    w = World()
    nodes = w.register(node_obj(A, 2))
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A])
    notes = placement_annotations(w.state.jobs[job.job_id], 0)
    on_node = kube_pod(pod.name, pod.uid, 1, annotations=notes, node=A)
    assert [type(e) for e in events(w.round(nodes, seen(on_node)))] == [JobStarted]
    assert notes[PLACED_GPUS] == "0"
    down = kube_nodes(node_obj(A, 2, ready=False))
    w.round(down, seen(on_node))  # requeued; the pod, bound, is to be deleted
    w.round(nodes, seen(on_node))  # Ready again, before the pod's deletion is seen
    w.write(
        JobPlaced(
            job_id=job.job_id,
            attempt=2,
            node=GA,
            gpu_indexes=[1],
            gpu_uuids=["node-a_example-gpu1"],
            basis_seq=w.state.seq,
            cycle_position=0,
            policy=PolicyRef(name="test", version=1),
        )
    )
    found = w.round(nodes, seen(on_node))
    assert not any(isinstance(e, JobStarted) for e in events(found)), events(found)


def test_a_known_node_with_a_label_gone_bad_is_still_lost_when_not_ready() -> None:
    w, nodes = two_nodes()
    pod, _job = running(w, nodes)
    bad = {
        **nodes,
        **kube_nodes(node_obj(pod.node_name, 2, ready=False, labels={"gpuloom.io/pool": "shared"})),
    }
    found = kube_round(w.state, bad, seen(pod))
    assert found.skipped != [], "the bad label is said"
    assert [type(e) for e in events(found)] == [NodeLost]


def test_a_node_whose_new_spec_conflicts_is_still_lost_when_not_ready() -> None:
    w, nodes = two_nodes()
    pod, job = running(w, nodes)
    uuids = {"gpuloom.io/gpu-uuids": "GPU-real-0,GPU-real-1"}
    down = {**nodes, **kube_nodes(node_obj(pod.node_name, 2, ready=False, annotations=uuids))}
    found = kube_round(w.state, down, seen(pod))
    assert job.job_id in found.skipped[0][1], "the conflict is said"
    assert [type(e) for e in events(found)] == [NodeLost]


# --- time limits ----------------------------------------------------------------------------


def timed(limit: str) -> tuple[World, dict[str, KubeNode], Pod, JobState]:
    """A pod with a time limit, running."""
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1, annotations={TIME_LIMIT: limit})
    job = w.placed(pod, [A, B])
    on_node = bound(pod, host_of(job))
    assert [type(e) for e in events(w.round(nodes, seen(on_node)))] == [JobStarted]
    return w, nodes, on_node, w.state.jobs[job.job_id]


def test_a_pod_within_its_time_limit_runs_on() -> None:
    w, nodes, pod, job = timed("60s")
    assert job.started_at is not None
    at = job.started_at + timedelta(seconds=59)
    assert kube_round(w.state, nodes, PodsSeen({pod.uid: pod}, now=at)) == KubeRound(now=at)


def test_a_pod_past_its_time_limit_is_evicted_and_its_job_times_out() -> None:
    w, nodes, pod, job = timed("1m")
    assert job.started_at is not None
    at = job.started_at + timedelta(seconds=61)
    found = w.round(nodes, PodsSeen({pod.uid: pod}, now=at))
    assert found.decisions == []
    assert found.actions == [Evict(pod.namespace, pod.name, "its time limit of 60 s passed")]
    evicted = bound(pod, pod.node_name, deleting=True, phase="Running")
    [finished] = events(w.round(nodes, PodsSeen({pod.uid: evicted}, now=at)))
    assert isinstance(finished, JobFinished) and finished.outcome == "timed_out"
    assert phase_of(w, job.job_id) == "timed_out"
    assert w.holders() == {}


def test_without_the_time_no_time_limit_is_enforced() -> None:
    w, nodes, pod, _ = timed("1s")
    assert kube_round(w.state, nodes, seen(pod)) == KubeRound()


def test_a_placed_pod_kube_scheduler_set_aside_is_touched_once_per_period() -> None:
    """Annotated, but its attempt failed (a bind past kube-scheduler's timeout): without
    a touch it would wait for kube-scheduler's half-minute flush."""
    w, nodes = two_nodes()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A, B])
    notes = placement_annotations(job, 0)
    aside = replace(pod, annotations=notes, unschedulable=True)
    assert job.placed_at is not None
    soon, later = job.placed_at + timedelta(seconds=2), job.placed_at + NUDGE_EVERY * 2
    assert kube_round(w.state, nodes, PodsSeen({pod.uid: aside}, now=soon)).actions == []
    [touch] = kube_round(w.state, nodes, PodsSeen({pod.uid: aside}, now=later)).actions
    assert isinstance(touch, Annotate) and dict(touch.annotations).keys() == {NUDGED}
    touched = replace(aside, annotations={**notes, **dict(touch.annotations)})
    assert kube_round(w.state, nodes, PodsSeen({pod.uid: touched}, now=later)).actions == []
    waiting = replace(aside, unschedulable=False)  # in kube-scheduler's queue: left alone
    assert kube_round(w.state, nodes, PodsSeen({pod.uid: waiting}, now=later)).actions == []

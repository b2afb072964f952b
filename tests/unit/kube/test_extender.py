"""The scheduler extender's answers (filter, prioritize, bind) on folded states: a new
pod is submitted and waits, a waiting one is told gpuloom's own reason, a placed one
passes only where gpuloom placed it and is bound there with the GPUs' annotations."""

from __future__ import annotations

from dataclasses import replace

from gpuloom.decide.admission import decide_admission
from gpuloom.decide.explain import explain, reason_text
from gpuloom.events import (
    JobCancelled,
    JobCancelRequested,
    JobRejected,
    NodeCordoned,
    NodeLost,
    NodeRecovered,
)
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.kube.extender import (
    REASON_MOST,
    Reasons,
    bind_pod,
    filter_pod,
    placed_later,
    pod_job,
    prioritize_pod,
    replica_of,
)
from gpuloom.kube.pods import Pod, PodDefaults, PodProblem, job_id
from gpuloom.kube.vocabulary import (
    ATTEMPT,
    GANG,
    GPU_MILLI,
    JOB,
    LOCALITY,
    NODE_LENDS,
    NODE_POOL,
    NUDGED,
    PLACED_GPUS,
    PLACED_MEMORY,
    PLACED_NODE,
    PLACED_UUIDS,
    REPLICAS,
    TIME_LIMIT,
)
from gpuloom.kube.watch import queued_mark
from gpuloom.state import fold

from .kubeworld import World, kube_pod, node_obj, uid_of

A, B, C = "node-a.example", "node-b", "node-c"
OFFERED = [A, B, C]


def world(gpus: int = 2, **labels: str) -> World:
    """Three Kubernetes nodes of `gpus` GPUs each, registered by the watcher."""
    w = World()
    w.register(*(node_obj(name, gpus, labels=labels) for name in OFFERED))
    return w


def only_reason(failed: dict[str, str]) -> str:
    reasons = set(failed.values())
    assert len(reasons) == 1, reasons
    return reasons.pop()


# --- filter -----------------------------------------------------------------------------


def test_a_new_pod_is_submitted_and_fails_everywhere_with_one_reason() -> None:
    w = world()
    pod = kube_pod("train-0", uid_of(1), 2)
    answer = filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons)
    assert answer.passed == [] and set(answer.failed) == set(OFFERED)
    assert answer.submit is not None and answer.problem is None
    assert answer.submit.idempotency_key == pod.job_key == f"k8s:{uid_of(1)}"
    assert answer.submit.job_id == job_id(pod)
    assert answer.submit.spec.gpus == 2 and answer.submit.spec.kubernetes is not None
    why = only_reason(answer.failed)
    assert answer.submit.job_id in why and answer.waiting == why


def test_a_pod_asked_about_again_once_submitted_is_not_submitted_twice() -> None:
    w = world()
    pod = kube_pod("train-0", uid_of(1))
    w.submit(pod, OFFERED)
    again = filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons)
    assert again.submit is None and again.passed == []
    assert pod_job(w.state, pod)[0] == job_id(pod)


def test_a_pod_with_a_bad_annotation_fails_everywhere_with_its_problem_and_no_submit() -> None:
    w = world()
    pod = kube_pod("train-0", uid_of(1), annotations={TIME_LIMIT: "forever"})
    answer = filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons)
    assert answer.submit is None and answer.passed == []
    assert isinstance(answer.problem, PodProblem) and answer.problem.field == TIME_LIMIT
    why = only_reason(answer.failed)
    assert str(answer.problem) in why and answer.waiting == why
    assert set(answer.failed) == set(OFFERED)


def test_a_queued_job_fails_everywhere_with_explain_s_reason() -> None:
    w = world(gpus=1)
    pod = kube_pod("big", uid_of(1), 1)
    job = w.submit(pod, OFFERED)
    w.queue()
    assert w.state.jobs[job].phase == "queued"
    answer = filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons)
    why = only_reason(answer.failed)
    assert job in why and answer.waiting == why and answer.submit is None
    found = explain(w.state, job, brief=True)
    assert found is not None and found.reason is not None
    assert (reason_text(found.reason, found.detail) or found.reason) in why


def test_a_queued_job_that_does_not_fit_says_why() -> None:
    w = world(gpus=1)
    pod = kube_pod("first", uid_of(1), 1)
    w.placed(pod, OFFERED)
    others = [kube_pod(f"p{n}", uid_of(10 + n), 1) for n in range(3)]
    for other in others:
        w.submit(other, OFFERED)
    w.queue()
    w.place()
    waiting = [p for p in others if w.state.jobs[job_id(p)].phase == "queued"]
    assert len(waiting) == 1
    answer = filter_pod(w.state, waiting[0], OFFERED, w.defaults, w.reasons)
    assert job_id(waiting[0]) in only_reason(answer.failed)
    assert "waits" in only_reason(answer.failed)


def test_the_reason_follows_the_state_as_it_is_folded_in_place() -> None:
    w = world(gpus=1)
    pod = kube_pod("train-0", uid_of(1), 1)
    job = w.submit(pod, OFFERED)
    w.queue()
    before = only_reason(filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons).failed)
    w.write(*(NodeCordoned(node=name.replace(".", "_"), reason="maintenance") for name in OFFERED))
    fresh = only_reason(filter_pod(w.state, pod, OFFERED, w.defaults, Reasons()).failed)
    assert fresh != before, "a cordon of every node changes explain's reason"
    assert job in fresh
    kept = only_reason(filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons).failed)
    assert kept == fresh


def test_a_placed_pod_passes_only_its_host() -> None:
    w = world()
    pod = kube_pod("train-0", uid_of(1), 2)
    job = w.placed(pod, OFFERED)
    host = job.replicas[0].host.replace("_", ".")
    answer = filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons)
    assert answer.passed == [host] and answer.waiting is None and answer.submit is None
    assert set(answer.failed) == set(OFFERED) - {host}
    assert only_reason(answer.failed) == f"gpuloom placed this pod on {host}"


def test_the_host_is_given_by_its_kubernetes_name() -> None:
    w = World()
    w.register(node_obj(A, 2))
    pod = kube_pod("train-0", uid_of(1), 1)
    job = w.placed(pod, [A])
    assert job.replicas[0].host == "node-a_example"
    answer = filter_pod(w.state, pod, [A, B], w.defaults, w.reasons)
    assert answer.passed == [A]
    assert answer.failed == {B: f"gpuloom placed this pod on {A}"}


def test_a_placed_pod_whose_host_was_not_offered_fails_everywhere() -> None:
    w = world()
    pod = kube_pod("train-0", uid_of(1), 2)
    job = w.placed(pod, OFFERED)
    host = job.replicas[0].host.replace("_", ".")
    offered = [n for n in OFFERED if n != host]
    answer = filter_pod(w.state, pod, offered, w.defaults, w.reasons)
    assert answer.passed == [] and set(answer.failed) == set(offered)
    why = only_reason(answer.failed)
    assert host in why and "did not offer" in why and answer.waiting == why


def rejected(w: World) -> tuple[Pod, str]:
    """A pod whose time limit is past the cluster's maximum: admission rejects its job."""
    pod = kube_pod("long", uid_of(1), 1, annotations={TIME_LIMIT: "2d"})
    job = w.submit(pod, OFFERED)
    w.decide(decide_admission(w.state, max_time_limit_s=86400))
    return pod, job


def test_a_rejected_pod_says_its_job_ended_rejected() -> None:
    w = world()
    pod, job = rejected(w)
    assert job not in w.state.jobs and w.state.tombstones[job].phase == "rejected"
    answer = filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons)
    why = only_reason(answer.failed)
    assert answer.passed == [] and answer.submit is None
    assert job in why and "rejected" in why and answer.waiting == why


def test_a_rejected_pod_is_told_why() -> None:
    w = world()
    pod, _job = rejected(w)
    reason = w.log.records[-1].event.reason  # type: ignore[attr-defined]
    assert "time_limit_s" in reason
    answer = filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons)
    assert reason in only_reason(answer.failed)


def test_a_rejected_job_kept_in_the_state_says_why() -> None:
    w = world()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.submit(pod, OFFERED)
    w.write(JobRejected(job_id=job, reason="the account is closed"))
    kept = fold(w.log.records, keep_history=True)
    answer = filter_pod(kept, pod, OFFERED, w.defaults, Reasons())
    assert only_reason(answer.failed) == f"gpuloom job {job} was rejected: the account is closed"


def test_a_cancelled_pod_says_its_job_was_cancelled() -> None:
    w = world()
    pod = kube_pod("p", uid_of(1), 1)
    job = w.submit(pod, OFFERED)
    w.queue()
    w.write(JobCancelRequested(job_id=job, requested_by="alice"), JobCancelled(job_id=job))
    why = only_reason(filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons).failed)
    assert job in why and "cancelled" in why
    kept = fold(w.log.records, keep_history=True)
    why_kept = only_reason(filter_pod(kept, pod, OFFERED, w.defaults, Reasons()).failed)
    assert why_kept.startswith(f"gpuloom job {job} was cancelled")


def test_a_long_reason_is_shortened_for_kube_scheduler() -> None:
    w = world()
    pod = kube_pod("p", uid_of(1), 1, annotations={"gpuloom.io/" + "x" * 400: "1"})
    answer = filter_pod(w.state, pod, OFFERED, w.defaults, w.reasons)
    why = only_reason(answer.failed)
    assert len(why) == REASON_MOST and why.endswith("...")
    assert answer.waiting is not None and len(answer.waiting) > REASON_MOST


# --- prioritize -------------------------------------------------------------------------


def test_prioritize_scores_ten_for_the_host_and_zero_elsewhere() -> None:
    w = world()
    pod = kube_pod("train-0", uid_of(1), 2)
    assert prioritize_pod(w.state, pod, OFFERED) == [(n, 0) for n in OFFERED]
    job = w.placed(pod, OFFERED)
    host = job.replicas[0].host.replace("_", ".")
    assert prioritize_pod(w.state, pod, OFFERED) == [(n, 10 if n == host else 0) for n in OFFERED]


def test_prioritize_scores_nothing_while_the_job_waits() -> None:
    w = world()
    pod = kube_pod("train-0", uid_of(1), 2)
    w.submit(pod, OFFERED)
    w.queue()
    assert prioritize_pod(w.state, pod, OFFERED) == [(n, 0) for n in OFFERED]


# --- bind -------------------------------------------------------------------------------


def test_bind_refuses_a_pod_gpuloom_does_not_know() -> None:
    w = world()
    answer = bind_pod(w.state, kube_pod("p", uid_of(1)), A)
    assert answer.error is not None and "not known to gpuloom" in answer.error
    assert answer.annotations == {}


def test_bind_refuses_a_job_that_is_not_placed() -> None:
    w = world()
    pod = kube_pod("p", uid_of(1))
    job = w.submit(pod, OFFERED)
    w.queue()
    answer = bind_pod(w.state, pod, A)
    assert answer.error is not None and job in answer.error and "queued" in answer.error


def test_bind_refuses_another_node_than_the_host() -> None:
    w = world()
    pod = kube_pod("p", uid_of(1), 2)
    job = w.placed(pod, OFFERED)
    host = job.replicas[0].host.replace("_", ".")
    other = next(n for n in OFFERED if n != host)
    answer = bind_pod(w.state, pod, other)
    assert answer.error == f"gpuloom placed this pod on {host}, not {other}"


def test_bind_to_the_host_gives_the_placement_s_annotations() -> None:
    w = World()
    w.register(node_obj(A, 4))
    pod = kube_pod("p", uid_of(1), 2)
    job = w.placed(pod, [A])
    answer = bind_pod(w.state, pod, A)
    assert answer.error is None
    slices = job.replicas[0].slices
    assert answer.annotations == {
        PLACED_NODE: A,
        PLACED_GPUS: ",".join(str(s.index) for s in slices),
        PLACED_UUIDS: ",".join(s.uuid for s in slices),
        JOB: job.job_id,
        ATTEMPT: "1",
    }
    assert [s.uuid for s in slices] == [f"node-a_example-gpu{s.index}" for s in slices]
    assert PLACED_MEMORY not in answer.annotations, "whole GPUs: all their memory"


def test_bind_of_a_share_of_a_gpu_says_its_memory() -> None:
    w = World()
    w.register(node_obj(A, 1, labels={NODE_POOL: "vgpu"}))
    pod = kube_pod("p", uid_of(1), 1, annotations={GPU_MILLI: "250"})
    job = w.placed(pod, [A])
    [piece] = job.replicas[0].slices
    assert piece.milli == 250 < MILLI_PER_GPU
    answer = bind_pod(w.state, pod, A)
    assert answer.error is None
    assert answer.annotations[PLACED_MEMORY] == str(piece.memory_mib)
    assert answer.annotations[PLACED_GPUS] == "0"


def test_the_annotations_name_the_current_attempt() -> None:
    w = World()
    w.register(node_obj(A, 1))
    pod = kube_pod("p", uid_of(1), 1)
    job = w.placed(pod, [A])
    assert bind_pod(w.state, pod, A).annotations[ATTEMPT] == "1"
    # NodeLost requeues the job; its node comes back
    w.write(
        NodeLost(node="node-a_example", reason="NotReady"), NodeRecovered(node="node-a_example")
    )
    assert w.state.jobs[job.job_id].phase == "queued"
    w.place()
    assert bind_pod(w.state, pod, A).annotations[ATTEMPT] == "2"


# --- gangs ------------------------------------------------------------------------------


def gang_pod(index: int, replicas: int = 2, name: str = "trainer") -> Pod:
    return kube_pod(
        f"{name}-{index}",
        uid_of(100 + index),
        1,
        annotations={GANG: name, REPLICAS: str(replicas)},
        owner_uid="jobset-1",
    )


def gang_world() -> tuple[World, list[Pod], list[str]]:
    """A gang of two one-GPU pods, placed over two one-GPU nodes."""
    w = World()
    w.register(node_obj(A, 1), node_obj(B, 1))
    pods = [gang_pod(0), gang_pod(1)]
    job = w.placed(pods[0], [A, B])
    assert len(job.replicas) == 2 and job.spec.replicas == 2
    hosts = [r.host.replace("_", ".") for r in job.replicas]
    assert sorted(hosts) == sorted([A, B])
    return w, pods, hosts


def test_a_gang_is_one_job_for_all_its_pods() -> None:
    w, pods, _ = gang_world()
    assert pod_job(w.state, pods[0])[0] == pod_job(w.state, pods[1])[0]


def test_each_pod_of_a_gang_passes_the_host_of_its_replica_by_sorted_name() -> None:
    w, pods, hosts = gang_world()
    names = ["trainer-1", "trainer-0"]
    for index, pod in enumerate(pods):
        answer = filter_pod(w.state, pod, [A, B], w.defaults, w.reasons, names)
        assert answer.passed == [hosts[index]], index
        assert bind_pod(w.state, pod, hosts[index], names).error is None
        assert bind_pod(w.state, pod, hosts[1 - index], names).error is not None
        notes = bind_pod(w.state, pod, hosts[index], names).annotations
        assert notes[PLACED_NODE] == hosts[index]


def test_a_gang_pod_waits_while_its_gang_is_not_known() -> None:
    w, pods, _ = gang_world()
    answer = filter_pod(w.state, pods[0], [A, B], w.defaults, w.reasons, None)
    assert answer.passed == [] and "gang trainer has 0 pod(s) of the 2" in only_reason(
        answer.failed
    )
    assert bind_pod(w.state, pods[0], A, None).error is not None


def test_replica_of_maps_by_sorted_name() -> None:
    lone = kube_pod("solo", uid_of(1))
    assert replica_of(lone, None, 1) == 0
    pod = gang_pod(1, 3)
    assert replica_of(pod, ["trainer-2", "trainer-1", "trainer-0"], 3) == 1
    assert replica_of(pod, None, 3) is None
    assert replica_of(pod, ["trainer-0", "trainer-1"], 3) is None, "not all exist yet"
    four = ["trainer-0", "trainer-1", "trainer-2", "trainer-3"]
    assert replica_of(pod, four, 3) is None, "one pod too many: which is extra is not known"
    written = replace(pod, annotations={**pod.annotations, "gpuloom.io/replica": "2"})
    assert replica_of(written, ["trainer-1"], 3) == 2, "the replica written at placement holds"


def test_a_gang_pod_waits_while_not_every_pod_of_its_gang_exists() -> None:
    w, pods, hosts = gang_world()
    second = pods[1]
    answer = filter_pod(w.state, second, [A, B], w.defaults, w.reasons, ["trainer-1"])
    assert answer.passed == [], f"trainer-1 passes {answer.passed}, replica 0 is on {hosts[0]}"
    assert bind_pod(w.state, second, hosts[0], ["trainer-1"]).error is not None


def test_a_defaults_account_and_class_are_used_for_new_pods() -> None:
    w = world()
    defaults = PodDefaults(account="team-pool", default_class="batch", priorities=(("batch", 5),))
    answer = filter_pod(w.state, kube_pod("p", uid_of(1)), OFFERED, defaults, w.reasons)
    assert answer.submit is not None
    assert answer.submit.spec.account == "team-pool"
    assert (answer.submit.spec.priority_class, answer.submit.spec.priority) == ("batch", 5)


def test_the_pod_s_creation_time_orders_its_job_id() -> None:
    early = kube_pod("a", uid_of(9), created="2025-01-01T11:00:00Z")
    late = replace(kube_pod("b", uid_of(1)), created=early.created.replace(hour=13))
    assert job_id(early) < job_id(late)


def test_a_share_lent_by_another_node_is_named_with_its_kubernetes_node() -> None:
    w = World()
    vgpu = {NODE_POOL: "vgpu"}
    w.register(
        node_obj(A, 1, labels=vgpu),
        node_obj("lender.example", 1, labels={**vgpu, NODE_LENDS: "true"}),
    )
    notes = {GPU_MILLI: "500", LOCALITY: "local-first"}
    pod = kube_pod("p", uid_of(1), 2, annotations=notes)
    job = w.placed(pod, [A])
    assert [s.node for s in job.replicas[0].slices] == ["node-a_example", "lender_example"]
    answer = bind_pod(w.state, pod, A)
    assert answer.error is None
    assert answer.annotations[PLACED_GPUS] == "0,lender.example/0"
    assert answer.annotations[PLACED_UUIDS] == "node-a_example-gpu0,lender_example-gpu0"
    assert answer.annotations[PLACED_MEMORY] == "8192,8192"


def test_only_a_queued_mark_or_a_newer_attempt_makes_a_filter_wait_for_its_fold() -> None:
    """The watcher's nudge of a pod gpuloom never heard of is a bare number: it says
    nothing about the job, so the extender must not wait a second for it (it did, and
    kube-scheduler, one pod at a time, spent its time in those waits)."""
    w = world()
    pod = kube_pod("p", uid_of(1), 1)
    assert not placed_later(w.state, replace(pod, annotations={NUDGED: "179667000"}))
    assert placed_later(w.state, replace(pod, annotations={NUDGED: queued_mark(0)}))
    assert placed_later(w.state, replace(pod, annotations={ATTEMPT: "1"}))

"""gpuloom as the GPU scheduler of a real Kubernetes control plane (docs/kubernetes.md):
kube-scheduler v1.20 asks gpuloom's extender to filter, prioritize and bind every pod
that asks for `gpuloom.io/gpu`; gpuloom's watcher turns the Nodes into gpuloom nodes
and the pods' ends into job ends. Everything is checked through the Kubernetes API
(bindings, annotations, events) and gpuloom's log (the jobs' events, the charges, and
`gpuloom audit`, which re-makes every placement).

No kubelet runs: a Node keeps the status it is created with, pods stay Pending once
bound (`spec.nodeName` says where), and a test ends a pod by patching its status.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest
from kube_fixtures import bound_node, eventually, kube_stack, messages, pod_events

from gpuloom.events import (
    JobCancelled,
    JobFinished,
    JobPreempted,
    JobStarted,
    JobSubmitted,
    NodeLost,
    Recorded,
    UsageCharged,
)
from gpuloom.kube.vocabulary import PLACED_GPUS, PLACED_NODE
from gpuloom.kube.vocabulary import PRIORITY_CLASS as PRIORITY
from gpuloom.kubeapi import KubeClient, node_path, pod_path
from gpuloom.state import ClusterState, apply
from gpuloom.testing.cluster import Cluster
from gpuloom.testing.kubecluster import KubeControlPlane, make_node, make_pod

pytestmark = pytest.mark.integration

NS = "default"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KubeControlPlane, Cluster]]:
    with kube_stack(tmp_path_factory.mktemp("kube")) as both:
        yield both
        both[1].assert_audit_passes()


@pytest.fixture
async def kube(stack: tuple[KubeControlPlane, Cluster]) -> KubeClient:
    async with KubeClient(stack[0].kube_config()) as client:
        yield client  # type: ignore[misc]


@pytest.fixture(scope="module")
def nodes(stack: tuple[KubeControlPlane, Cluster]) -> list[str]:
    """k-a: 4 A100 (physical); k-b: 2 H100 (physical); k-v: 1 A100 in the vGPU pool,
    advertised as 10 device IDs (split 10); k-c: not a GPU node (no gpuloom.io/gpu)."""

    async def make() -> None:
        async with KubeClient(stack[0].kube_config()) as client:
            await make_node(
                client, "k-a", 4, {"gpuloom.io/model": "A100", "gpuloom.io/topology-rack": "r1"}
            )
            await make_node(
                client, "k-b", 2, {"gpuloom.io/model": "H100", "gpuloom.io/topology-rack": "r2"}
            )
            await make_node(
                client,
                "k-v",
                10,
                {
                    "gpuloom.io/model": "A100",
                    "gpuloom.io/pool": "vgpu",
                    "gpuloom.io/gpu-split": "10",
                },
            )
            await make_node(client, "k-c", 0)
            # k-c offers no GPU resource at all: remove it from capacity
            await client.patch_merge(
                f"{node_path('k-c')}/status",
                {
                    "status": {
                        "capacity": {"gpuloom.io/gpu": None},
                        "allocatable": {"gpuloom.io/gpu": None},
                    }
                },
            )

    asyncio.run(make())
    stack[1].wait_nodes_ready(3, timeout=30)
    return ["k-a", "k-b", "k-v"]


async def test_a_pod_asking_for_a_model_is_bound_where_gpuloom_placed_it(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    _, cluster = stack
    await make_pod(kube, NS, "train-h100", 1, {"gpuloom.io/model": "H100"})
    node = await eventually(lambda: bound_node(kube, NS, "train-h100"), 30, "the pod bound")
    assert node == "k-b"
    pod = await kube.get(pod_path(NS, "train-h100"))
    notes = pod["metadata"]["annotations"]
    assert notes[PLACED_NODE] == "k-b"
    assert notes[PLACED_GPUS] in ("0", "1")
    uid = pod["metadata"]["uid"]

    def started() -> JobStarted | None:
        log = cluster.read_log()
        submitted = [
            r.event
            for r in log
            if isinstance(r.event, JobSubmitted) and r.event.idempotency_key == f"k8s:{uid}"
        ]
        assert len(submitted) <= 1, "one JobSubmitted per pod, however often asked"
        return next(
            (
                r.event
                for r in log
                if isinstance(r.event, JobStarted)
                and submitted
                and r.event.job_id == submitted[0].job_id
            ),
            None,
        )

    async def probe() -> JobStarted | None:
        return await asyncio.to_thread(started)

    begun = await eventually(probe, 15, "the pod's job started in gpuloom's log")
    assert begun.node == "k-b"


async def test_a_bad_annotation_is_said_on_the_pod_and_the_extender_stays_up(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    await make_pod(kube, NS, "bad-milli", 1, {"gpuloom.io/gpu-milli": "2000"})

    async def said() -> str | None:
        text = messages(await pod_events(kube, NS, "bad-milli"))
        return text if "gpuloom.io/gpu-milli" in text else None

    text = await eventually(said, 30, "an event naming the bad annotation")
    assert "must be from 1 to 999" in text
    # the extender answers the next pod as before
    await make_pod(
        kube, NS, "after-bad", 1, {"gpuloom.io/model": "A100", "gpuloom.io/pool": "physical"}
    )
    node = await eventually(lambda: bound_node(kube, NS, "after-bad"), 30, "the next pod bound")
    assert node == "k-a"
    assert await bound_node(kube, NS, "bad-milli") == ""


async def test_four_quarter_vgpu_pods_share_one_gpu(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    for n in range(4):
        await make_pod(kube, NS, f"quarter-{n}", 1, {"gpuloom.io/gpu-milli": "250"})
    for n in range(4):
        node = await eventually(lambda n=n: bound_node(kube, NS, f"quarter-{n}"), 30, "bound")
        assert node == "k-v"
    gpus = set()
    for n in range(4):
        pod = await kube.get(pod_path(NS, f"quarter-{n}"))
        gpus.add(pod["metadata"]["annotations"][PLACED_GPUS])
    assert gpus == {"0"}


async def test_pods_beyond_capacity_wait_with_gpuloom_s_reason_then_bind_when_one_ends(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    _, cluster = stack
    # k-b has 2 H100: one holds train-h100 (first test) or is free; fill it
    await make_pod(kube, NS, "h100-big", 2, {"gpuloom.io/model": "H100"})

    async def waiting() -> str | None:
        text = messages(await pod_events(kube, NS, "h100-big"))
        return text if "gpuloom job" in text and " waits: " in text else None

    text = await eventually(waiting, 30, "a FailedScheduling event with gpuloom's reason")
    assert "Resources" in text, text
    # the first pod ends: its GPU frees, the waiting pod is bound
    await kube.patch_pod_status(NS, "train-h100", {"phase": "Succeeded"})
    node = await eventually(lambda: bound_node(kube, NS, "h100-big"), 60, "the waiting pod bound")
    assert node == "k-b"
    pod = await kube.get(pod_path(NS, "train-h100"))
    uid = pod["metadata"]["uid"]

    def charged() -> bool:
        log = cluster.read_log()
        job = next(
            r.event.job_id
            for r in log
            if isinstance(r.event, JobSubmitted) and r.event.idempotency_key == f"k8s:{uid}"
        )
        ended = [r.event for r in log if isinstance(r.event, JobFinished) and r.event.job_id == job]
        charges = [
            r.event for r in log if isinstance(r.event, UsageCharged) and r.event.job_id == job
        ]
        return (
            bool(ended)
            and ended[0].outcome == "succeeded"
            and any(c.period_end is None and c.seconds > 0 for c in charges)
        )

    async def probe() -> bool:
        return await asyncio.to_thread(charged)

    await eventually(probe, 20, "the ended pod's job charged")


async def test_a_deleted_node_s_jobs_are_requeued(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    _, cluster = stack
    await make_node(kube, "k-gone", 1, {"gpuloom.io/model": "V100"})
    await make_pod(kube, NS, "on-gone", 1, {"gpuloom.io/model": "V100"})
    assert await eventually(lambda: bound_node(kube, NS, "on-gone"), 30, "bound") == "k-gone"
    await kube.delete(node_path("k-gone"))

    def lost() -> bool:
        return any(
            isinstance(r.event, NodeLost) and r.event.node == "k-gone" for r in cluster.read_log()
        )

    async def probe() -> bool:
        return await asyncio.to_thread(lost)

    await eventually(probe, 20, "NodeLost for the deleted node")

    # the job was requeued with the node (the fold); the pod bound there cannot move: the
    # watcher deletes it, and its job, pending again, is cancelled
    async def deleted() -> bool:
        items, _ = await kube.list(pod_path(NS))
        return all(i["metadata"]["name"] != "on-gone" for i in items)

    await eventually(deleted, 30, "the pod of the lost node deleted")
    log = await log_of(cluster)
    job = next(
        r.event.job_id
        for r in log
        if isinstance(r.event, JobSubmitted) and r.event.spec.name == "on-gone"
    )
    state = ClusterState()
    for record in log:
        apply(state, record)
        if isinstance(record.event, NodeLost) and record.event.node == "k-gone":
            assert state.jobs[job].phase == "queued", "requeued when its node was lost"

    async def cancelled() -> bool:
        return any(
            isinstance(r.event, JobCancelled) and r.event.job_id == job
            for r in await log_of(cluster)
        )

    await eventually(cancelled, 20, "the requeued job of the deleted pod cancelled")


def _read(cluster: Cluster) -> list[Recorded]:
    return cluster.read_log()


async def log_of(cluster: Cluster) -> list[Recorded]:
    return await asyncio.to_thread(_read, cluster)


async def test_waiting_pods_are_bound_in_gpuloom_s_priority_order(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    _, cluster = stack
    for name, priority in (("k8s-low", 10), ("k8s-high", 100)):
        body = {"priority": priority, "may_preempt": False}
        response = cluster.http.put(f"/v1/priority-classes/{name}", json=body)
        assert response.status_code == 200, response.text
    await make_node(kube, "k-p", 1, {"gpuloom.io/model": "P100"})
    await make_pod(kube, NS, "p-first", 1, {"gpuloom.io/model": "P100"})
    assert await eventually(lambda: bound_node(kube, NS, "p-first"), 30, "bound") == "k-p"
    await make_pod(kube, NS, "p-low", 1, {"gpuloom.io/model": "P100", PRIORITY: "k8s-low"})
    await make_pod(kube, NS, "p-high", 1, {"gpuloom.io/model": "P100", PRIORITY: "k8s-high"})

    async def both_wait() -> bool:
        texts = [messages(await pod_events(kube, NS, n)) for n in ("p-low", "p-high")]
        return all("gpuloom job" in t for t in texts)

    await eventually(both_wait, 30, "both pods waiting with gpuloom's reason")
    await kube.patch_pod_status(NS, "p-first", {"phase": "Succeeded"})
    assert await eventually(lambda: bound_node(kube, NS, "p-high"), 30, "p-high bound") == "k-p"
    assert await bound_node(kube, NS, "p-low") == "", "the lower class waits"
    await kube.patch_pod_status(NS, "p-high", {"phase": "Failed"})
    assert await eventually(lambda: bound_node(kube, NS, "p-low"), 30, "p-low bound") == "k-p"
    ended = [r.event for r in await log_of(cluster) if isinstance(r.event, JobFinished)]
    assert "failed" in {e.outcome for e in ended}


async def test_a_higher_class_pod_preempts_by_eviction(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    _, cluster = stack
    for name, priority in (("k8s-batch", 5), ("k8s-urgent", 500)):
        body = {"priority": priority, "may_preempt": True}
        assert cluster.http.put(f"/v1/priority-classes/{name}", json=body).status_code == 200
    await make_node(kube, "k-q", 1, {"gpuloom.io/model": "Q100"})
    victim = {"gpuloom.io/model": "Q100", PRIORITY: "k8s-batch", "gpuloom.io/preemptible": "true"}
    await make_pod(kube, NS, "q-victim", 1, victim)
    assert await eventually(lambda: bound_node(kube, NS, "q-victim"), 30, "bound") == "k-q"
    await make_pod(kube, NS, "q-urgent", 1, {"gpuloom.io/model": "Q100", PRIORITY: "k8s-urgent"})

    async def evicted() -> bool:
        items, _ = await kube.list(pod_path(NS))
        return all(i["metadata"]["name"] != "q-victim" for i in items)

    await eventually(evicted, 30, "the victim pod evicted")
    assert await eventually(lambda: bound_node(kube, NS, "q-urgent"), 30, "bound") == "k-q"
    log = await log_of(cluster)
    assert any(isinstance(r.event, JobPreempted) for r in log)


async def test_a_gang_is_bound_whole_or_not_at_all(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    await make_node(kube, "k-g1", 1, {"gpuloom.io/model": "G100"})
    await make_node(kube, "k-g2", 1, {"gpuloom.io/model": "G100"})
    gang = {"gpuloom.io/model": "G100", "gpuloom.io/gang": "allreduce", "gpuloom.io/replicas": "2"}
    too_big = {"gpuloom.io/model": "G100", "gpuloom.io/gang": "big", "gpuloom.io/replicas": "3"}
    for n in range(3):
        await make_pod(kube, NS, f"big-{n}", 1, too_big)
    for n in range(2):
        await make_pod(kube, NS, f"allreduce-{n}", 1, gang)
    bound = [
        await eventually(lambda n=n: bound_node(kube, NS, f"allreduce-{n}"), 30, "gang bound")
        for n in range(2)
    ]
    assert sorted(bound) == ["k-g1", "k-g2"]
    for n in range(3):
        assert await bound_node(kube, NS, f"big-{n}") == "", "a gang of 3 on 2 GPUs: none bound"
    text = messages(await pod_events(kube, NS, "big-0"))
    assert "gpuloom job" in text


async def test_the_extender_killed_mid_run_binds_nothing_twice(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    _, cluster = stack
    assert cluster.stack is not None
    await make_node(kube, "k-r", 2, {"gpuloom.io/model": "R100"})
    await make_pod(kube, NS, "r-before", 1, {"gpuloom.io/model": "R100"})
    assert await eventually(lambda: bound_node(kube, NS, "r-before"), 30, "bound") == "k-r"
    cluster.stack.kill("extender")  # SIGKILL
    for n in range(3):
        await make_pod(kube, NS, f"r-during-{n}", 1, {"gpuloom.io/model": "R100"})
    await asyncio.sleep(2)
    cluster.stack.spawn("extender")
    # the watcher touches pods gpuloom never heard of: kube-scheduler asks again within
    # seconds, not after its minute-long wait; two GPUs: one before, one more now

    async def one_more_bound() -> list[str] | None:
        held = [await bound_node(kube, NS, f"r-during-{n}") for n in range(3)]
        return held if sorted(held) == ["", "", "k-r"] else None

    await eventually(one_more_bound, 40, "one of the pods made while it was down bound")
    await asyncio.sleep(2)
    assert await one_more_bound(), "and no more than one"
    state = ClusterState()
    for record in await log_of(cluster):
        apply(state, record)
    wrong = [v for v in state.recent_voided if v.type in ("JobPlaced", "JobStarted")]
    assert not wrong, wrong
    submitted = [r.event for r in await log_of(cluster) if isinstance(r.event, JobSubmitted)]
    keys = [e.idempotency_key for e in submitted]
    assert len(keys) == len(set(keys)), "one JobSubmitted per pod"


async def test_a_pod_past_its_time_limit_is_evicted_and_its_job_timed_out(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    _, cluster = stack
    await make_node(kube, "k-t", 1, {"gpuloom.io/model": "T4"})
    await make_pod(
        kube, NS, "t-short", 1, {"gpuloom.io/model": "T4", "gpuloom.io/time-limit": "2s"}
    )
    assert await eventually(lambda: bound_node(kube, NS, "t-short"), 30, "bound") == "k-t"

    async def evicted() -> bool:
        items, _ = await kube.list(pod_path(NS))
        return all(i["metadata"]["name"] != "t-short" for i in items)

    await eventually(evicted, 30, "the pod evicted at its time limit")

    async def timed_out() -> JobFinished | None:
        return next(
            (
                r.event
                for r in await log_of(cluster)
                if isinstance(r.event, JobFinished) and r.event.outcome == "timed_out"
            ),
            None,
        )

    ended = await eventually(timed_out, 20, "JobFinished timed_out")
    assert ended.node == "k-t"


async def test_local_only_waits_where_local_first_takes_a_share_another_node_lends(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    """Two nodes with one L4 each in the vGPU pool, the second lending shares to pods on
    other nodes (OrionX's remote vGPU): a pod asking two half L4s fits no node alone. Kept
    local it waits; local-first, it runs on one node with the other's share."""
    vgpu = {"gpuloom.io/model": "L4", "gpuloom.io/pool": "vgpu", "gpuloom.io/gpu-split": "10"}
    await make_node(kube, "k-l1", 10, vgpu)
    await make_node(kube, "k-l2", 10, {**vgpu, "gpuloom.io/lends-remote-vgpu": "true"})
    ask = {"gpuloom.io/model": "L4", "gpuloom.io/gpu-milli": "500"}
    await make_pod(kube, NS, "l-only", 2, {**ask, "gpuloom.io/locality": "local-only"})

    async def waits() -> str | None:
        text = messages(await pod_events(kube, NS, "l-only"))
        return text if " waits: " in text else None

    await eventually(waits, 30, "the local-only pod waiting with gpuloom's reason")
    await make_pod(kube, NS, "l-first", 2, {**ask, "gpuloom.io/locality": "local-first"})
    host = await eventually(lambda: bound_node(kube, NS, "l-first"), 30, "local-first bound")
    pod = await kube.get(pod_path(NS, "l-first"))
    gpus = pod["metadata"]["annotations"][PLACED_GPUS].split(",")
    assert host == "k-l1" and gpus == ["0", "k-l2/0"], (host, gpus)
    assert await bound_node(kube, NS, "l-only") == ""


async def test_the_watcher_restarted_catches_up_with_what_happened_meanwhile(
    stack: tuple[KubeControlPlane, Cluster], nodes: list[str], kube: KubeClient
) -> None:
    _, cluster = stack
    assert cluster.stack is not None
    await make_node(kube, "k-w", 1, {"gpuloom.io/model": "W100"})
    await make_node(kube, "k-w2", 1, {"gpuloom.io/model": "X100"})
    await make_pod(kube, NS, "w-run", 1, {"gpuloom.io/model": "W100"})
    assert await eventually(lambda: bound_node(kube, NS, "w-run"), 30, "bound") == "k-w"

    async def job_of_pod() -> str | None:
        return next(
            (
                r.event.job_id
                for r in await log_of(cluster)
                if isinstance(r.event, JobStarted) and r.event.node == "k-w"
            ),
            None,
        )

    job = await eventually(job_of_pod, 20, "the pod's job started")
    cluster.stack.kill("kubewatch")  # SIGKILL
    await kube.patch_pod_status(
        NS,
        "w-run",
        {
            "phase": "Failed",
            "containerStatuses": [
                {
                    "name": "main",
                    "ready": False,
                    "restartCount": 0,
                    "image": "none:0",
                    "imageID": "",
                    "state": {"terminated": {"exitCode": 3}},
                }
            ],
        },
    )
    await kube.delete(node_path("k-w2"))
    await asyncio.sleep(1)
    cluster.stack.spawn("kubewatch")

    async def caught_up() -> bool:
        log = await log_of(cluster)
        ended = [r.event for r in log if isinstance(r.event, JobFinished) and r.event.job_id == job]
        lost = any(isinstance(r.event, NodeLost) and r.event.node == "k-w2" for r in log)
        return bool(ended) and ended[0].outcome == "failed" and ended[0].exit_code == 3 and lost

    await eventually(caught_up, 30, "the pod's failure (exit 3) and the node's loss in the log")

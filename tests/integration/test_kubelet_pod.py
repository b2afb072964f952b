"""A real pod, end to end: gpuloom schedules it, a real kubelet runs it (docs/kubernetes.md;
issue #51, point 3).

A real kubelet v1.20.2 (built from Debian 12's `kubernetes` source package by
`tools/kubernetes/kubelet.sh`) with Debian's containerd and runc registers a Node with
the control plane of kube_fixtures.kube_stack; gpuloom's device plugin advertises two
simulated GPUs to it; a pod asking for one `gpuloom.io/gpu` is bound by gpuloom's
extender, the kubelet asks the plugin's `Allocate`, and the container (an image made here
from Debian's static busybox, imported: no registry) prints its environment and exits 0.
Checked: the GPU in the container's environment is the one gpuloom chose, the pod ends
`Succeeded`, and gpuloom's log has the job started, finished (succeeded, exit 0) and charged.

Needs root, the kubelet and containerd (skips with the reason otherwise). containerd and
the kubelet run as child processes in the test's temporary directory and are stopped by
pid; their containers, shims, mounts and cgroups are removed, the kubelet's sysctls put back.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from kube_fixtures import bound_node, eventually, kube_stack

from gpuloom.events import JobFinished, JobStarted, JobSubmitted, Recorded, UsageCharged
from gpuloom.kube.vocabulary import ALLOCATED, PLACED_GPUS, PLACED_NODE, PLACED_UUIDS
from gpuloom.kubeapi import KubeClient, NotFound, node_path, pod_path
from gpuloom.testing.cluster import Cluster
from gpuloom.testing.kubecluster import GPU_RESOURCE, KubeControlPlane
from gpuloom.testing.kubelet import POD_LOG_DIR, Containerd, Kubelet, unavailable
from gpuloom.testing.ociimage import IMAGE, write_busybox_image

pytestmark = pytest.mark.integration

NS = "default"
NODE = "kubelet-node"
MODEL = "SIM"
GPUS = 2
SPLIT = 10
REPO = Path(__file__).resolve().parents[2]


@dataclass
class RealNode:
    plane: KubeControlPlane
    cluster: Cluster
    containerd: Containerd
    kubelet: Kubelet
    plugin_log: Path


def _start_plugin(plane: KubeControlPlane, log_path: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "NODE_NAME": NODE,
        "GPULOOM_DEVICE_PLUGIN_DIR": "/var/lib/kubelet/device-plugins",
        "GPULOOM_DEVICE_PLUGIN_GPUS": str(GPUS),
        "GPULOOM_DEVICE_SPLIT": str(SPLIT),
        "GPULOOM_KUBECONFIG": str(plane.kubeconfig_path),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "services.deviceplugin"],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def _node_ready(kube: KubeClient) -> bool:
    try:
        node = await kube.get(node_path(NODE))
    except NotFound:  # not registered yet
        return False
    conditions = (node.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def _gpu_capacity(kube: KubeClient) -> str | None:
    node = await kube.get(node_path(NODE))
    return ((node.get("status") or {}).get("allocatable") or {}).get(GPU_RESOURCE)


@pytest.fixture(scope="module")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealNode]:
    reason = unavailable()
    if reason:
        pytest.skip(reason)
    base = tmp_path_factory.mktemp("kubelet")
    with kube_stack(base) as (plane, cluster):
        containerd = Containerd(base / "containerd")
        kubelet = Kubelet(
            base / "kubelet",
            kubeconfig=plane.kubeconfig_path,
            node_name=NODE,
            runtime_endpoint=containerd.endpoint,
        )
        plugin: subprocess.Popen[bytes] | None = None
        try:
            t0 = time.monotonic()
            containerd.start()
            containerd.import_image(write_busybox_image(base / "busybox-oci.tar"))
            kubelet.start()

            async def ready_and_labelled() -> None:
                async with KubeClient(plane.kube_config()) as kube:
                    await eventually(lambda: _node_ready(kube), 90, "the kubelet's Node Ready")
                    await kube.patch_merge(
                        node_path(NODE), {"metadata": {"labels": {"gpuloom.io/model": MODEL}}}
                    )

            asyncio.run(ready_and_labelled())
            t1 = time.monotonic()
            plugin = _start_plugin(plane, base / "deviceplugin.log")

            async def advertised() -> None:
                async with KubeClient(plane.kube_config()) as kube:
                    want = str(GPUS * SPLIT)

                    async def probe() -> bool:
                        return await _gpu_capacity(kube) == want

                    await eventually(probe, 60, f"the Node's {GPU_RESOURCE} allocatable {want}")

            asyncio.run(advertised())
            cluster.wait_nodes_ready(1, timeout=30)
            print(
                f"containerd + image + kubelet -> Node Ready: {t1 - t0:.1f}s; "
                f"device plugin -> gpuloom node ready: {time.monotonic() - t1:.1f}s"
            )
            yield RealNode(plane, cluster, containerd, kubelet, base / "deviceplugin.log")
        except BaseException:
            for name, text in (
                ("kubelet", kubelet.log_tail(60)),
                ("containerd", containerd.log_tail(30)),
            ):
                print(f"--- {name} (tail) ---\n{text}")
            raise
        finally:
            _stop(plugin)
            kubelet.stop()
            containerd.stop()
            kubelet.remove_cgroups()


def _log_of(cluster: Cluster) -> list[Recorded]:
    return cluster.read_log()


async def test_a_real_pod_runs_on_the_gpu_gpuloom_chose_and_is_charged(
    real_node: RealNode,
) -> None:
    plane, cluster = real_node.plane, real_node.cluster
    async with KubeClient(plane.kube_config()) as kube:
        begun = time.monotonic()
        await kube.create(
            pod_path(NS),
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": "real",
                    "namespace": NS,
                    "annotations": {"gpuloom.io/model": MODEL},
                },
                "spec": {
                    "hostNetwork": True,
                    "restartPolicy": "Never",
                    "terminationGracePeriodSeconds": 5,
                    "containers": [
                        {
                            "name": "main",
                            "image": IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["/bin/sh", "-c", "env | sort; echo gpuloom-pod-done"],
                            "resources": {"limits": {GPU_RESOURCE: "1"}},
                        }
                    ],
                },
            },
        )
        node = await eventually(lambda: bound_node(kube, NS, "real"), 30, "the pod bound")
        assert node == NODE

        async def ended() -> str | None:
            pod = await kube.get(pod_path(NS, "real"))
            phase = (pod.get("status") or {}).get("phase")
            return phase if phase in ("Succeeded", "Failed") else None

        phase = await eventually(ended, 120, "the pod ended")
        print(f"pod created -> {phase} in {time.monotonic() - begun:.1f}s")
        pod = await kube.get(pod_path(NS, "real"))
        assert phase == "Succeeded", pod.get("status")
        notes = pod["metadata"]["annotations"]
        assert notes[PLACED_NODE] == NODE
        assert notes.get(ALLOCATED), "the kubelet called the device plugin's Allocate"
        gpu = notes[PLACED_GPUS]
        assert gpu in {str(i) for i in range(GPUS)}
        uid = pod["metadata"]["uid"]

    # the container's own output, from the kubelet's log file of it
    logs = sorted((POD_LOG_DIR / f"{NS}_real_{uid}" / "main").glob("*.log"))
    assert logs, f"no container log under {POD_LOG_DIR}"
    env = {}
    for line in logs[0].read_text().splitlines():
        # CRI log format: TIMESTAMP STREAM TAG MESSAGE
        message = line.split(" ", 3)[-1]
        key, eq, value = message.partition("=")
        if eq:
            env[key] = value
    print(
        f"container log {logs[0]}: "
        + " ".join(f"{k}={env[k]}" for k in ("GPULOOM_GPUS", "NVIDIA_VISIBLE_DEVICES") if k in env)
    )
    assert "gpuloom-pod-done" in logs[0].read_text()
    assert env.get("GPULOOM_GPUS") == gpu
    assert env.get("NVIDIA_VISIBLE_DEVICES") == notes[PLACED_UUIDS] == f"GPU-sim-{NODE}-{gpu}"

    def charged() -> tuple[JobStarted, JobFinished, UsageCharged] | None:
        log = cluster.read_log()
        job = next(
            (
                r.event.job_id
                for r in log
                if isinstance(r.event, JobSubmitted) and r.event.idempotency_key == f"k8s:{uid}"
            ),
            None,
        )
        started = [
            r.event for r in log if isinstance(r.event, JobStarted) and r.event.job_id == job
        ]
        finished = [
            r.event for r in log if isinstance(r.event, JobFinished) and r.event.job_id == job
        ]
        final = [
            r.event
            for r in log
            if isinstance(r.event, UsageCharged)
            and r.event.job_id == job
            and r.event.period_end is None
        ]
        if job and started and finished and final:
            return started[0], finished[0], final[0]
        return None

    async def probe() -> tuple[JobStarted, JobFinished, UsageCharged] | None:
        return await asyncio.to_thread(charged)

    started, finished, charge = await eventually(probe, 30, "the pod's job started, ended, charged")
    assert started.node == NODE
    assert finished.outcome == "succeeded" and finished.exit_code == 0, finished
    assert charge.seconds >= 0
    await asyncio.to_thread(cluster.assert_audit_passes)

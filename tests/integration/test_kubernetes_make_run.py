"""`GPULOOM_KUBECONFIG=... make run` (docs/kubernetes.md, "Try it"): the stack starts the
extender and the watcher beside the services, no simulated nodes, and its banner gives
the `extenders:` stanza; a pod asking `gpuloom.io/gpu: 1` with a GPU model is then bound
by gpuloom, as a newcomer following the docs would see it. Without the variable nothing
changes (the other devstack tests)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from kube_fixtures import bound_node, eventually

from gpuloom.devstack import REPO_ROOT, wait_http
from gpuloom.kube.vocabulary import PLACED_NODE
from gpuloom.kubeapi import KubeClient, pod_path
from gpuloom.natsserver import free_ports
from gpuloom.testing.kubecluster import SKIP_REASON, KubeControlPlane, binaries, make_node, make_pod

pytestmark = pytest.mark.integration


async def test_make_run_with_a_kubeconfig_schedules_the_cluster_s_gpu_pods(tmp_path: Path) -> None:
    if binaries() is None:
        pytest.skip(SKIP_REASON)
    extender_port, gateway_port, nats_port = free_ports(3)
    log = tmp_path / "make-run.log"
    plane = KubeControlPlane(
        tmp_path / "k8s", extender_url=f"http://127.0.0.1:{extender_port}/scheduler"
    )
    with plane:
        plane.start()
        env = {k: v for k, v in os.environ.items() if not k.startswith("GPULOOM_")}
        env |= {
            "GPULOOM_DATA_DIR": str(tmp_path / "stack"),
            "GPULOOM_GATEWAY_PORT": str(gateway_port),
            "GPULOOM_NATS_PORT": str(nats_port),
            "GPULOOM_KUBECONFIG": str(plane.kubeconfig_path),
            "GPULOOM_EXTENDER_PORT": str(extender_port),
        }
        with log.open("wb") as out:
            launcher = subprocess.Popen(
                [sys.executable, "-m", "gpuloom.devstack"],
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            await asyncio.to_thread(wait_http, f"http://127.0.0.1:{gateway_port}/healthz", 90)
            deadline = time.monotonic() + 30
            while "extenders:" not in log.read_text() and time.monotonic() < deadline:
                await asyncio.sleep(0.1)
            text = log.read_text()
            banner = text[text.index("Kubernetes: gpuloom schedules") :]
            pasted = banner[banner.index("  extenders:") :].splitlines()
            block = [line[2:] for line in pasted if line.startswith("  ")]
            stanza = yaml.safe_load("\n".join(block[: block.index("") if "" in block else None]))
            [extender] = stanza["extenders"]
            assert extender["urlPrefix"] == f"http://127.0.0.1:{extender_port}/scheduler"
            assert extender["managedResources"] == [
                {"name": "gpuloom.io/gpu", "ignoredByScheduler": True}
            ]
            await asyncio.to_thread(wait_http, f"http://127.0.0.1:{extender_port}/healthz", 60)
            running = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
            assert "services.extender" in running and "services.kubewatch" in running
            agents = [
                line
                for line in running.splitlines()
                if "services.agent" in line and str(tmp_path) in line
            ]
            assert not agents, "Kubernetes supplies the nodes: no simulated ones"

            async with KubeClient(plane.kube_config()) as kube:
                await make_node(kube, "gpu-1", 2, {"gpuloom.io/model": "A100"})
                await make_node(kube, "gpu-2", 2, {"gpuloom.io/model": "H100"})
                await make_pod(kube, "default", "train", 1, {"gpuloom.io/model": "H100"})
                node = await eventually(lambda: bound_node(kube, "default", "train"), 60, "bound")
                assert node == "gpu-2"
                pod = await kube.get(pod_path("default", "train"))
                assert pod["metadata"]["annotations"][PLACED_NODE] == "gpu-2"
        finally:
            os.killpg(launcher.pid, signal.SIGINT)
            try:
                launcher.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(launcher.pid, signal.SIGKILL)
                launcher.wait()
        assert launcher.returncode == 0, log.read_text()[-3000:]

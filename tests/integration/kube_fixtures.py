"""A real Kubernetes control plane (etcd, kube-apiserver, kube-scheduler v1.20) whose
scheduler asks gpuloom's extender, beside a real gpuloom stack running the extender and
the watcher: what tests/integration/test_kubernetes*.py share."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from gpuloom.kubeapi import KubeClient, Obj, pod_path
from gpuloom.natsserver import free_ports
from gpuloom.testing.cluster import Cluster
from gpuloom.testing.kubecluster import SKIP_REASON, KubeControlPlane, binaries, gpuloom_for
from gpuloom.testing.servers import nats_jetstream

T = TypeVar("T")


@contextlib.contextmanager
def kube_stack(
    base: Path, env: dict[str, str] | None = None
) -> Iterator[tuple[KubeControlPlane, Cluster]]:
    """The control plane and a gpuloom stack with no agents: Kubernetes supplies the
    nodes. The extender listens on a free loopback port that kube-scheduler calls."""
    if binaries() is None:
        pytest.skip(SKIP_REASON)
    (extender_port,) = free_ports(1)
    plane = KubeControlPlane(
        base / "k8s", extender_url=f"http://127.0.0.1:{extender_port}/scheduler"
    )
    with plane, nats_jetstream(base / "nats") as nats_url:
        plane.start()
        cluster = gpuloom_for(plane, nats_url, base, extender_port, env)
        try:
            cluster.start()
            yield plane, cluster
        finally:
            cluster.stop()
            for log in sorted((base / "data" / "logs").glob("*.log")):
                text = log.read_text(errors="replace")
                if "Traceback" in text:
                    print(f"--- {log.name} (tail) ---\n{text[-4000:]}")


async def eventually(probe: Callable[[], Awaitable[T | None]], timeout: float, what: str) -> T:
    """The first truthy answer of `probe`, asked every 0.1 s for `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        found = await probe()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout}s: {what}")
        await asyncio.sleep(0.1)


async def bound_node(kube: KubeClient, namespace: str, name: str) -> str:
    pod = await kube.get(pod_path(namespace, name))
    return str((pod.get("spec") or {}).get("nodeName") or "")


async def pod_events(kube: KubeClient, namespace: str, name: str) -> list[Obj]:
    items, _ = await kube.list(
        f"/api/v1/namespaces/{namespace}/events",
        field_selector=f"involvedObject.name={name}",
    )
    return items


def messages(events: list[Any]) -> str:
    return "\n".join(f"{e.get('reason')}: {e.get('message')}" for e in events)

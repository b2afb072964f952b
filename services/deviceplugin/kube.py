"""What the plugin needs of the Kubernetes API, and the real client that gives it.

`KubeApi` is the part of `gpuloom.kubeapi.client.KubeClient` the plugin calls: list the
pods bound to this node, annotate one, and merge-patch its own Node (the GPUs' UUIDs and
the split, which the extender reads). `KubeClient` fits it as it is; the integration
tests hand the plugin pods kept in memory instead.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Protocol

from gpuloom.kubeapi import KubeClient, KubeConfig, node_path

PODS = "/api/v1/pods"


class KubeApi(Protocol):
    async def list(
        self,
        path: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]: ...

    async def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> object: ...

    async def patch_merge(self, path: str, body: dict[str, Any]) -> object: ...


async def pods_on_node(api: KubeApi, node: str) -> list[dict[str, Any]]:
    """The pods bound to `node`, in every namespace."""
    items, _ = await api.list(PODS, field_selector=f"spec.nodeName={node}")
    return items


async def annotate_node(api: KubeApi, node: str, annotations: Mapping[str, str]) -> None:
    """Set annotations of the Node `node` (a JSON merge patch: the others stay)."""
    await api.patch_merge(node_path(node), {"metadata": {"annotations": dict(annotations)}})


def kube_client(environ: Mapping[str, str] = os.environ) -> KubeClient:
    """The client of the API server: from the kubeconfig at `GPULOOM_KUBECONFIG` (or
    `KUBECONFIG`) when set, else the pod's service account (a DaemonSet's pod)."""
    path = environ.get("GPULOOM_KUBECONFIG") or environ.get("KUBECONFIG")
    config = KubeConfig.load(path) if path else KubeConfig.in_cluster(environ=environ)
    return KubeClient(config, user_agent="gpuloom-deviceplugin")

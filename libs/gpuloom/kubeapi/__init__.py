"""A small async client of the Kubernetes REST API (on httpx), for gpuloom's scheduler
extender and its node/pod watcher.

    config = KubeConfig.load("~/.kube/config")   # or KubeConfig.in_cluster()
    async with KubeClient(config) as kube:
        nodes, rv = await kube.list("/api/v1/nodes", label_selector="gpuloom.io/pool")
        async with contextlib.aclosing(kube.watch("/api/v1/nodes", rv)) as changes:
            async for kind, node in changes:   # ADDED, MODIFIED, DELETED, BOOKMARK
                ...                            # Gone: list again, watch from there

Refusals raise `ApiError` (`NotFound`, `Conflict`, `Gone`); no answer: `Unreachable`.
"""

from gpuloom.kubeapi.client import (
    DEFAULT_LIMITS,
    DEFAULT_TIMEOUT,
    KubeClient,
    Obj,
    Unreachable,
    node_path,
    now_rfc3339,
    pod_path,
)
from gpuloom.kubeapi.config import SERVICE_ACCOUNT_DIR, KubeConfig
from gpuloom.kubeapi.errors import ApiError, Conflict, Gone, KubeConfigError, NotFound

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "SERVICE_ACCOUNT_DIR",
    "ApiError",
    "Conflict",
    "Gone",
    "KubeClient",
    "KubeConfig",
    "KubeConfigError",
    "NotFound",
    "Obj",
    "Unreachable",
    "node_path",
    "now_rfc3339",
    "pod_path",
]

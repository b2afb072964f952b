"""`KubeClient`: the few calls of the Kubernetes REST API that gpuloom's scheduler extender
and its node/pod watcher make, on httpx, with bounded timeouts and connection pool.

Paths are the API's own (`/api/v1/nodes`, `/api/v1/namespaces/NS/pods/NAME`); objects go
and come as the API's JSON, in plain dicts. A refusal raises `ApiError` (`NotFound`,
`Conflict`, `Gone`); a server that cannot be reached raises `Unreachable`.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import AsyncGenerator, Generator, Mapping
from datetime import UTC, datetime
from types import TracebackType
from typing import Any, Literal

import httpx

from gpuloom.kubeapi.config import KubeConfig
from gpuloom.kubeapi.errors import ApiError, api_error, status_error

Obj = dict[str, Any]
Objects = list[Obj]
Params = dict[str, str]

#: connect 5 s; a reply within 30 s; a free connection of the pool within 10 s.
DEFAULT_TIMEOUT = httpx.Timeout(connect=5.0, read=30.0, write=30.0, pool=10.0)
#: a watch holds a connection while it lasts: room for a few watches beside the calls.
DEFAULT_LIMITS = httpx.Limits(max_connections=16, max_keepalive_connections=8, keepalive_expiry=30)
#: how long past its `timeoutSeconds` a watch may stay silent before it counts as dead.
WATCH_READ_MARGIN_S = 15.0
#: Connections of the pool kept for long watches (the others serve calls).
WATCHES_KEPT = 4
#: how often a `tokenFile` (a rotating service-account token) is read again.
TOKEN_REFRESH_S = 60.0

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"


class Unreachable(ApiError):
    """The API server could not be reached, or did not answer in time (status 0)."""


def pod_path(namespace: str, name: str | None = None) -> str:
    """`/api/v1/namespaces/NS/pods[/NAME]`."""
    base = f"/api/v1/namespaces/{namespace}/pods"
    return f"{base}/{name}" if name else base


def node_path(name: str | None = None) -> str:
    """`/api/v1/nodes[/NAME]`."""
    return f"/api/v1/nodes/{name}" if name else "/api/v1/nodes"


def now_rfc3339() -> str:
    """The time now as the API writes it (metav1.Time: seconds, UTC)."""
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class _Bearer(httpx.Auth):
    """`Authorization: Bearer` from the config; a token file is read again every
    `TOKEN_REFRESH_S` (service-account tokens rotate)."""

    def __init__(self, config: KubeConfig) -> None:
        self._config = config
        self._token: str | None = None
        self._read_at = float("-inf")

    def auth_flow(self, request: httpx.Request) -> Generator[httpx.Request, httpx.Response, None]:
        if self._config.token_file and time.monotonic() - self._read_at > TOKEN_REFRESH_S:
            self._token, self._read_at = self._config.bearer_token(), time.monotonic()
        elif self._token is None:
            self._token = self._config.bearer_token()
        if self._token:
            request.headers["Authorization"] = f"Bearer {self._token}"
        yield request


class KubeClient:
    """An async client of one API server. Use it as an async context manager (or call
    `aclose`): it holds a pool of connections.

    `watch` is an async generator: a caller that stops before the watch ends closes it
    with `contextlib.aclosing(client.watch(...))`, which gives its connection back."""

    def __init__(
        self,
        config: KubeConfig,
        *,
        timeout: httpx.Timeout = DEFAULT_TIMEOUT,
        limits: httpx.Limits = DEFAULT_LIMITS,
        user_agent: str = "gpuloom",
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self.config = config
        self._timeout = timeout
        # Calls wait here, never inside httpcore's pool: a wait for a pool slot that is
        # cut short (a caller's timeout) while the pool is busy leaks the slot there
        # (encode/httpcore#1093), and after enough of them every call fails with
        # PoolTimeout although no connection is open. Room is kept for the watches,
        # which hold a connection each for minutes.
        most = limits.max_connections or DEFAULT_LIMITS.max_connections or 16
        self._calls = asyncio.Semaphore(max(1, most - WATCHES_KEPT))
        verify: ssl.SSLContext | bool = (
            config.ssl_context() if config.server.startswith("https:") else True
        )
        self._http = httpx.AsyncClient(
            base_url=config.server,
            verify=verify,
            auth=_Bearer(config),
            timeout=timeout,
            limits=limits,
            headers={"Accept": JSON, "User-Agent": user_agent},
            transport=transport,
        )

    async def __aenter__(self) -> KubeClient:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # -- the verbs -----------------------------------------------------------------------

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Any = None,
        content_type: str = JSON,
    ) -> Obj:
        """One call; the decoded JSON reply (`{}` when it has none). Raises `ApiError`
        (`NotFound`, `Conflict`, `Gone`) on a refusal, `Unreachable` when no answer came."""
        headers = {}
        content = None
        if body is not None:
            content = json.dumps(body).encode()
            headers["Content-Type"] = content_type
        try:
            async with self._calls:  # never more than the pool holds: see __init__
                response = await self._http.request(
                    method, path, params=params, content=content, headers=headers
                )
        except httpx.TransportError as exc:
            raise _unreachable(method, path, exc) from exc
        if response.is_error:
            raise _refusal(response)
        if not response.content:
            return {}
        decoded = response.json()
        return decoded if isinstance(decoded, dict) else {"items": decoded}

    async def get(self, path: str, params: Mapping[str, str] | None = None) -> Obj:
        return await self.request("GET", path, params=params)

    async def list(
        self,
        path: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
        *,
        page_size: int | None = None,
    ) -> tuple[Objects, str]:
        """The objects at a collection `path` and the list's resourceVersion, from which
        `watch` goes on. `page_size` reads it in pages (`limit`/`continue`), one snapshot."""
        params = _selectors(label_selector, field_selector)
        if page_size:
            params["limit"] = str(page_size)
        items: Objects = []
        while True:
            reply = await self.get(path, params)
            items.extend(reply.get("items") or [])
            meta = reply.get("metadata") or {}
            token = meta.get("continue")
            if not page_size or not token:
                return items, str(meta.get("resourceVersion", ""))
            params["continue"] = str(token)

    async def watch(
        self,
        path: str,
        resource_version: str | None,
        timeout_s: float = 300.0,
        *,
        label_selector: str | None = None,
        field_selector: str | None = None,
        bookmarks: bool = True,
    ) -> AsyncGenerator[tuple[str, Obj], None]:
        """The changes of a collection after `resource_version` (from `list`), as
        `(type, object)`: ADDED, MODIFIED, DELETED and, with `bookmarks`, BOOKMARK (only
        its `metadata.resourceVersion` means anything: where to watch from next). Ends
        when the server closes the watch, after about `timeout_s`; watch again from the
        last resourceVersion seen. Raises `Gone` when that resourceVersion is too old
        (a 410, or an ERROR event of code 410): list again, then watch from the list's."""
        params = _selectors(label_selector, field_selector)
        params["watch"] = "1"
        params["timeoutSeconds"] = str(max(1, int(timeout_s)))
        if bookmarks:
            params["allowWatchBookmarks"] = "true"
        if resource_version:
            params["resourceVersion"] = resource_version
        timeout = httpx.Timeout(
            connect=self._timeout.connect,
            read=timeout_s + WATCH_READ_MARGIN_S,
            write=self._timeout.write,
            pool=self._timeout.pool,
        )
        try:
            async with self._http.stream("GET", path, params=params, timeout=timeout) as response:
                if response.is_error:
                    await response.aread()
                    raise _refusal(response)
                async for line in response.aiter_lines():
                    if not line.strip():
                        continue
                    event = json.loads(line)
                    kind, obj = str(event.get("type", "")), event.get("object") or {}
                    if kind == "ERROR":
                        raise status_error(obj)
                    yield kind, obj
        except httpx.TransportError as exc:
            raise _unreachable("WATCH", path, exc) from exc

    async def create(self, path: str, body: Obj) -> Obj:
        """POST `body` to a collection (or a subresource such as `binding`)."""
        return await self.request("POST", path, body=body)

    async def patch_merge(self, path: str, body: Obj) -> Obj:
        """A JSON merge patch (RFC 7386): maps merge, lists are replaced, None deletes."""
        return await self.request("PATCH", path, body=body, content_type=MERGE_PATCH)

    async def delete(
        self,
        path: str,
        *,
        grace_period_s: int | None = None,
        propagation: Literal["Orphan", "Background", "Foreground"] | None = None,
    ) -> Obj:
        """DELETE, with DeleteOptions when given. Returns the object (with its
        deletionTimestamp while it terminates) or a Status."""
        options = _delete_options(grace_period_s, propagation)
        return await self.request("DELETE", path, body=options or None)

    # -- pods ----------------------------------------------------------------------------

    async def bind_pod(self, namespace: str, name: str, uid: str, node: str) -> None:
        """Bind the pod to `node` (what a scheduler extender's `bind` verb must do itself).
        Raises `Conflict` when the pod is already bound, `NotFound` when it is gone. `uid`
        goes in the Binding's metadata, but kube-apiserver v1.20.2 does not check it (a
        Binding with another pod's UID binds; seen in tests): a caller that must not bind
        a pod made again under the same name compares the UID itself first."""
        await self.create(
            f"{pod_path(namespace, name)}/binding",
            {
                "apiVersion": "v1",
                "kind": "Binding",
                "metadata": {"name": name, "namespace": namespace, "uid": uid},
                "target": {"apiVersion": "v1", "kind": "Node", "name": node},
            },
        )

    async def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> Obj:
        """Set the pod's annotations (None removes one); the others stay. Returns the pod."""
        return await self.patch_merge(
            pod_path(namespace, name), {"metadata": {"annotations": dict(annotations)}}
        )

    async def evict_pod(
        self, namespace: str, name: str, *, grace_period_s: int | None = None
    ) -> None:
        """Evict the pod through the eviction subresource (policy/v1beta1 in 1.20; it
        honours PodDisruptionBudgets: 429 `ApiError` when one forbids it now). A pod bound
        to a node terminates gracefully (its kubelet ends it) unless `grace_period_s=0`;
        a pod that is unbound, Succeeded or Failed is deleted at once."""
        body: Obj = {
            "apiVersion": "policy/v1beta1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
        }
        options = _delete_options(grace_period_s, None)
        if options:
            body["deleteOptions"] = options
        await self.create(f"{pod_path(namespace, name)}/eviction", body)

    async def patch_pod_status(self, namespace: str, name: str, status: Obj) -> Obj:
        """Merge `status` into the pod's status (the `status` subresource), e.g.
        `{"phase": "Succeeded"}`. Returns the pod."""
        return await self.patch_merge(f"{pod_path(namespace, name)}/status", {"status": status})

    async def record_event(
        self,
        involved: Obj,
        reason: str,
        message: str,
        type: Literal["Warning", "Normal"] = "Warning",
        component: str = "gpuloom",
    ) -> Obj:
        """A core/v1 Event about `involved` (a pod as the API returned it), in its
        namespace, as `kubectl describe` shows them. Returns the Event."""
        meta = involved.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        name = str(meta.get("name", ""))
        stamp = now_rfc3339()
        involved_ref = {
            "apiVersion": involved.get("apiVersion", "v1"),
            "kind": involved.get("kind", "Pod"),
            "name": name,
            "namespace": namespace,
            "uid": meta.get("uid", ""),
        }
        if meta.get("resourceVersion"):
            involved_ref["resourceVersion"] = meta["resourceVersion"]
        return await self.create(
            f"/api/v1/namespaces/{namespace}/events",
            {
                "apiVersion": "v1",
                "kind": "Event",
                # client-go's naming: the object's name and the time in hex nanoseconds
                "metadata": {"name": f"{name}.{time.time_ns():x}", "namespace": namespace},
                "involvedObject": involved_ref,
                "reason": reason,
                "message": message,
                "type": type,
                "firstTimestamp": stamp,
                "lastTimestamp": stamp,
                "count": 1,
                "source": {"component": component},
            },
        )


def _selectors(label_selector: str | None, field_selector: str | None) -> Params:
    params: Params = {}
    if label_selector:
        params["labelSelector"] = label_selector
    if field_selector:
        params["fieldSelector"] = field_selector
    return params


def _delete_options(grace_period_s: int | None, propagation: str | None) -> Obj:
    options: Obj = {}
    if grace_period_s is not None:
        options["gracePeriodSeconds"] = grace_period_s
    if propagation is not None:
        options["propagationPolicy"] = propagation
    return options


def _refusal(response: httpx.Response) -> ApiError:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text
    return api_error(response.status_code, body)


def _unreachable(method: str, path: str, exc: httpx.TransportError) -> Unreachable:
    return Unreachable(0, "Unreachable", f"{method} {path}: {type(exc).__name__}: {exc}")

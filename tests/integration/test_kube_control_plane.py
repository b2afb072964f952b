"""`gpuloom.kubeapi` and `gpuloom.testing.kubecluster` against a real Kubernetes control plane
(etcd, kube-apiserver and kube-scheduler v1.20.2, built by `make kube`): one control plane
for the module, with a scheduler extender served from the test (asyncio, in a thread of
its own, binding through `KubeClient`). Without the binaries those tests skip; the
kubeconfig and stanza tests run anyway."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from gpuloom.kubeapi import (
    ApiError,
    Conflict,
    Gone,
    KubeClient,
    KubeConfig,
    KubeConfigError,
    NotFound,
    Obj,
    Unreachable,
    pod_path,
)
from gpuloom.natsserver import free_ports
from gpuloom.testing.kubecluster import (
    GPU_RESOURCE,
    SKIP_REASON,
    KubeControlPlane,
    binaries,
    make_node,
    make_pod,
    scheduler_config_stanza,
)

pytestmark = pytest.mark.integration

NS = "default"
#: the test extender keeps only these nodes (comma-separated) in `filter`...
KEEP = "test.gpuloom.io/nodes"
#: ...and gives this one the top score in `prioritize`
PREFER = "test.gpuloom.io/prefer"
#: a scheduler that does not exist: kube-scheduler leaves the pod alone
NOBODY = "nobody-scheduler"


class Extender:
    """A kube-scheduler extender (filter, prioritize, bind) on an asyncio HTTP/1.1 server
    in a thread with its own event loop, so that it outlives each test's loop. It binds
    through `KubeClient.bind_pod`, and records `(verb, pod name)` of every call."""

    def __init__(self) -> None:
        self.port = free_ports(1)[0]
        self.calls: list[tuple[str, str]] = []
        self.errors: list[str] = []
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stopping: asyncio.Event | None = None
        self._thread: threading.Thread | None = None
        self._kube: KubeClient | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/scheduler"

    def verbs(self, pod: str) -> list[str]:
        return [verb for verb, name in self.calls if name == pod]

    def start(self, config: KubeConfig) -> None:
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(config),))
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the test extender did not start")

    def stop(self) -> None:
        if self._loop is not None and self._stopping is not None:
            self._loop.call_soon_threadsafe(self._stopping.set)
        if self._thread is not None:
            self._thread.join(10)

    async def _main(self, config: KubeConfig) -> None:
        self._loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        async with KubeClient(config) as kube:
            self._kube = kube
            server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)
            self._ready.set()
            async with server:
                await self._stopping.wait()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                method, target, _ = line.decode().split(" ", 2)
                headers = {}
                while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    key, _, value = header.decode().partition(":")
                    headers[key.strip().lower()] = value.strip()
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                status, reply = await self._answer(method, target, body)
                data = json.dumps(reply).encode()
                head = (
                    f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\n"
                    f"Content-Length: {len(data)}\r\n\r\n"
                )
                writer.write(head.encode() + data)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _answer(self, method: str, target: str, body: bytes) -> tuple[str, Any]:
        verb = target.rsplit("/", 1)[-1]
        if method != "POST" or not target.startswith("/scheduler/"):
            return "404 Not Found", {"Error": f"no {method} {target}"}
        args = json.loads(body)
        if verb == "bind":
            self.calls.append(("bind", args["PodName"]))
            assert self._kube is not None
            try:
                await self._kube.bind_pod(
                    args["PodNamespace"], args["PodName"], args["PodUID"], args["Node"]
                )
            except ApiError as exc:
                self.errors.append(str(exc))
                return "200 OK", {"Error": str(exc)}
            return "200 OK", {"Error": ""}
        pod = args["Pod"]
        self.calls.append((verb, pod["metadata"]["name"]))
        annotations = pod["metadata"].get("annotations") or {}
        nodes = args["Nodes"]["items"]  # nodeCacheCapable: false, so whole Nodes come
        if verb == "filter":
            wanted = set(filter(None, annotations.get(KEEP, "").split(",")))
            keep = [n for n in nodes if not wanted or n["metadata"]["name"] in wanted]
            failed = {
                n["metadata"]["name"]: "test extender: not chosen" for n in nodes if n not in keep
            }
            return "200 OK", {"Nodes": {"items": keep}, "FailedNodes": failed, "Error": ""}
        if verb == "prioritize":
            prefer = annotations.get(PREFER)
            return "200 OK", [
                {
                    "Host": n["metadata"]["name"],
                    "Score": 10 if n["metadata"]["name"] == prefer else 0,
                }
                for n in nodes
            ]
        return "404 Not Found", {"Error": f"no verb {verb}"}


@pytest.fixture(scope="module")
def extender() -> Iterator[Extender]:
    ext = Extender()
    yield ext
    ext.stop()


@pytest.fixture(scope="module")
def control_plane(
    tmp_path_factory: pytest.TempPathFactory, extender: Extender
) -> Iterator[KubeControlPlane]:
    """etcd + kube-apiserver, then the extender, then kube-scheduler calling it."""
    if binaries() is None:
        pytest.skip(SKIP_REASON)
    cp = KubeControlPlane(
        tmp_path_factory.mktemp("k8s"), extender_url=extender.url, node_cache_capable=False
    )
    try:
        cp.start(scheduler=False)
        extender.start(cp.kube_config())
        cp.start_scheduler()
        yield cp
    finally:
        cp.stop()


@pytest.fixture
async def kube(control_plane: KubeControlPlane) -> AsyncIterator[KubeClient]:
    async with KubeClient(control_plane.kube_config()) as client:
        yield client


async def eventually(check: Callable[[], Awaitable[Any]], timeout: float = 30.0) -> Any:
    """The first truthy result of `check`, polled every 0.1 s."""
    async with asyncio.timeout(timeout):
        while not (result := await check()):
            await asyncio.sleep(0.1)
        return result


async def bound_node(kube: KubeClient, name: str, timeout: float = 30.0) -> str:
    async def node() -> str | None:
        pod = await kube.get(pod_path(NS, name))
        node_name: str | None = pod["spec"].get("nodeName")
        return node_name

    return str(await eventually(node, timeout))


# -- the scheduler and its extender ------------------------------------------------------


async def test_the_scheduler_asks_the_extender_which_binds_the_pod(
    kube: KubeClient, extender: Extender
) -> None:
    await make_node(kube, "ext-a", gpus=4, labels={"pool": "ext"})
    await make_node(kube, "ext-b", gpus=4, labels={"pool": "ext"})
    await make_pod(kube, NS, "one-gpu", gpus=1, annotations={KEEP: "ext-b"})
    assert await bound_node(kube, "one-gpu") == "ext-b"
    assert extender.verbs("one-gpu") == ["filter", "bind"]  # one node left: no prioritize
    pod = await kube.get(pod_path(NS, "one-gpu"))
    scheduled = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert scheduled and scheduled[0]["status"] == "True"
    assert pod["status"]["phase"] == "Pending"  # no kubelet runs it

    # two nodes pass the filter: the scheduler asks for scores too
    await make_pod(kube, NS, "scored", gpus=2, annotations={KEEP: "ext-a,ext-b", PREFER: "ext-a"})
    assert await bound_node(kube, "scored") == "ext-a"
    assert extender.verbs("scored") == ["filter", "prioritize", "bind"]

    # no gpuloom.io/gpu asked: the extender is never consulted, the default binder binds
    await make_pod(kube, NS, "no-gpu", gpus=0, node_selector={"pool": "ext"})
    assert await bound_node(kube, "no-gpu") in {"ext-a", "ext-b"}
    assert extender.verbs("no-gpu") == []
    assert extender.errors == []


async def test_a_pod_with_a_priority_is_scheduled_after_a_scheduler_restart(
    control_plane: KubeControlPlane, kube: KubeClient, extender: Extender
) -> None:
    old = control_plane.pid("scheduler")
    control_plane.restart_scheduler()
    assert control_plane.running("scheduler") and control_plane.pid("scheduler") != old
    await make_node(kube, "restart-a", gpus=8)
    pod = await make_pod(kube, NS, "urgent", gpus=8, annotations={KEEP: "restart-a"}, priority=1000)
    assert pod["spec"]["priorityClassName"] == "gpuloom-priority-1000"
    assert pod["spec"]["priority"] == 1000
    assert await bound_node(kube, "urgent") == "restart-a"
    assert "bind" in extender.verbs("urgent")


# -- list and watch ----------------------------------------------------------------------


async def test_list_then_watch_sees_a_node_added_then_deleted(kube: KubeClient) -> None:
    nodes, rv = await kube.list("/api/v1/nodes", label_selector="test=watch")
    assert nodes == [] and rv

    async def changes() -> list[tuple[str, str]]:
        seen: list[tuple[str, str]] = []
        async with contextlib.aclosing(
            kube.watch("/api/v1/nodes", rv, timeout_s=20, label_selector="test=watch")
        ) as events:
            async for kind, obj in events:
                if kind == "BOOKMARK":
                    assert obj["metadata"]["resourceVersion"]
                    continue
                seen.append((kind, obj["metadata"]["name"]))
                if kind == "DELETED":
                    return seen
        return seen

    watching = asyncio.create_task(changes())
    await make_node(kube, "watched", gpus=2, labels={"test": "watch"})
    await kube.delete("/api/v1/nodes/watched")
    async with asyncio.timeout(20):
        assert await watching == [("ADDED", "watched"), ("DELETED", "watched")]
    nodes, _ = await kube.list("/api/v1/nodes", label_selector="test=watch")
    assert nodes == []
    all_nodes, _ = await kube.list("/api/v1/nodes", page_size=1)
    names = [n["metadata"]["name"] for n in all_nodes]
    assert len(names) == len(set(names)) >= 1


# -- pods --------------------------------------------------------------------------------


async def test_annotate_mark_succeeded_then_evict(kube: KubeClient) -> None:
    await make_node(kube, "life-a", gpus=1)
    pod = await make_pod(
        kube, NS, "life", gpus=1, annotations={"keep": "me"}, scheduler_name=NOBODY
    )
    await kube.bind_pod(NS, "life", pod["metadata"]["uid"], "life-a")

    annotated = await kube.annotate_pod(NS, "life", {"gpuloom.io/job": "j-1", "x": "1"})
    assert annotated["metadata"]["annotations"] == {"keep": "me", "gpuloom.io/job": "j-1", "x": "1"}
    annotated = await kube.annotate_pod(NS, "life", {"x": None})
    assert annotated["metadata"]["annotations"] == {"keep": "me", "gpuloom.io/job": "j-1"}

    done = await kube.patch_pod_status(NS, "life", {"phase": "Succeeded"})
    assert done["status"]["phase"] == "Succeeded"
    assert (await kube.get(pod_path(NS, "life")))["status"]["phase"] == "Succeeded"

    await kube.evict_pod(NS, "life")
    with pytest.raises(NotFound):
        await kube.get(pod_path(NS, "life"))
    with pytest.raises(NotFound):
        await kube.evict_pod(NS, "life")


async def test_evicting_a_bound_pod_with_a_grace_period_leaves_it_terminating(
    kube: KubeClient,
) -> None:
    await make_node(kube, "grace-a", gpus=1)
    pod = await make_pod(kube, NS, "graceful", gpus=1, scheduler_name=NOBODY, grace_period_s=None)
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30
    await kube.bind_pod(NS, "graceful", pod["metadata"]["uid"], "grace-a")
    await kube.evict_pod(NS, "graceful")
    terminating = await kube.get(pod_path(NS, "graceful"))
    assert terminating["metadata"]["deletionTimestamp"]  # waits for a kubelet that never comes
    await kube.delete(pod_path(NS, "graceful"), grace_period_s=0)
    with pytest.raises(NotFound):
        await kube.get(pod_path(NS, "graceful"))


async def test_binding_a_bound_pod_again_conflicts(kube: KubeClient) -> None:
    await make_node(kube, "bind-a", gpus=1)
    await make_node(kube, "bind-b", gpus=1)
    pod = await make_pod(kube, NS, "twice", gpus=1, scheduler_name=NOBODY)
    uid = pod["metadata"]["uid"]
    assert "nodeName" not in pod["spec"]
    await kube.bind_pod(NS, "twice", uid, "bind-a")
    with pytest.raises(Conflict) as caught:
        await kube.bind_pod(NS, "twice", uid, "bind-b")
    assert caught.value.status == 409
    assert (await kube.get(pod_path(NS, "twice")))["spec"]["nodeName"] == "bind-a"
    with pytest.raises(NotFound):
        await kube.bind_pod(NS, "absent", uid, "bind-a")
    with pytest.raises(Conflict) as exists:
        await make_pod(kube, NS, "twice", gpus=1, scheduler_name=NOBODY)
    assert exists.value.reason == "AlreadyExists"


async def test_a_recorded_event_is_listed_with_its_pod(kube: KubeClient) -> None:
    pod = await make_pod(kube, NS, "noted", gpus=1, scheduler_name=NOBODY)
    await kube.record_event(pod, "GpuloomUnplaceable", "no node has 1 free GPU", type="Warning")
    await kube.record_event(pod, "GpuloomQueued", "queued behind 2 jobs", type="Normal")
    events, _ = await kube.list(
        f"/api/v1/namespaces/{NS}/events", field_selector="involvedObject.name=noted"
    )
    by_reason = {e["reason"]: e for e in events}
    assert set(by_reason) == {"GpuloomUnplaceable", "GpuloomQueued"}
    event = by_reason["GpuloomUnplaceable"]
    assert event["type"] == "Warning" and event["message"] == "no node has 1 free GPU"
    assert event["count"] == 1 and event["source"] == {"component": "gpuloom"}
    assert event["involvedObject"]["kind"] == "Pod"
    assert event["involvedObject"]["uid"] == pod["metadata"]["uid"]
    assert event["firstTimestamp"] == event["lastTimestamp"]
    assert by_reason["GpuloomQueued"]["type"] == "Normal"


async def test_a_node_carries_its_gpus_and_a_ready_condition(kube: KubeClient) -> None:
    made = await make_node(kube, "shape", gpus=8, labels={"gpuloom.io/pool": "a100"})
    node = await kube.get("/api/v1/nodes/shape")
    assert node["metadata"]["uid"] == made["metadata"]["uid"]
    assert node["status"]["allocatable"][GPU_RESOURCE] == "8"
    assert node["status"]["capacity"][GPU_RESOURCE] == "8"
    assert [(c["type"], c["status"]) for c in node["status"]["conditions"]] == [("Ready", "True")]
    assert not node["spec"].get("taints")  # TaintNodesByCondition is off
    patched = await kube.patch_merge("/api/v1/nodes/shape", {"metadata": {"labels": {"x": "y"}}})
    assert patched["metadata"]["labels"] == {"gpuloom.io/pool": "a100", "x": "y"}
    with pytest.raises(NotFound):
        await kube.get("/api/v1/nodes/absent")


def test_the_harness_kubeconfig_loads(control_plane: KubeControlPlane) -> None:
    config = KubeConfig.load(control_plane.kubeconfig_path)
    assert config.server == control_plane.api_url
    assert config.token == control_plane.token
    assert config.ca_file == control_plane.ca_file
    assert config.namespace == "default"


# -- the kubeconfig and the scheduler's configuration (no control plane needed) -----------


def test_a_yaml_kubeconfig_with_inline_data_and_a_token_file(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("abc\n")
    ca = b"-----BEGIN CERTIFICATE-----\nnot really\n-----END CERTIFICATE-----\n"
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "b",
        "contexts": [
            {"name": "a", "context": {"cluster": "c1", "user": "u1"}},
            {"name": "b", "context": {"cluster": "c2", "user": "u2", "namespace": "gpu"}},
        ],
        "clusters": [
            {"name": "c1", "cluster": {"server": "https://a:1"}},
            {
                "name": "c2",
                "cluster": {
                    "server": "https://b:6443/",
                    "certificate-authority-data": base64.b64encode(ca).decode(),
                },
            },
        ],
        "users": [
            {"name": "u1", "user": {"token": "t1"}},
            {
                "name": "u2",
                "user": {
                    "tokenFile": "token",  # relative to the kubeconfig
                    "client-certificate-data": base64.b64encode(b"cert").decode(),
                    "client-key-data": base64.b64encode(b"key").decode(),
                },
            },
        ],
    }
    (tmp_path / "config").write_text(yaml.safe_dump(doc))
    config = KubeConfig.load(tmp_path / "config")
    assert config.server == "https://b:6443"
    assert config.ca_data == ca and config.namespace == "gpu"
    assert config.token_file == tmp_path / "token" and config.bearer_token() == "abc"
    assert config.client_cert_data == b"cert" and config.client_key_data == b"key"
    assert KubeConfig.load(tmp_path / "config", context="a").token == "t1"
    with pytest.raises(KubeConfigError):
        KubeConfig.load(tmp_path / "config", context="nope")


def test_in_cluster_reads_the_service_account(tmp_path: Path) -> None:
    (tmp_path / "token").write_text("sa-token")
    (tmp_path / "namespace").write_text("gpuloom")
    env = {"KUBERNETES_SERVICE_HOST": "fd00::1", "KUBERNETES_SERVICE_PORT": "443"}
    config = KubeConfig.in_cluster(root=tmp_path, environ=env)
    assert config.server == "https://[fd00::1]:443"
    assert config.bearer_token() == "sa-token" and config.namespace == "gpuloom"
    assert config.ca_file is None  # no ca.crt there
    with pytest.raises(KubeConfigError):
        KubeConfig.in_cluster(root=tmp_path, environ={})


def test_the_extender_stanza() -> None:
    stanza = scheduler_config_stanza("http://127.0.0.1:9999/scheduler", http_timeout="3s")
    assert yaml.safe_load(stanza) == {
        "extenders": [
            {
                "urlPrefix": "http://127.0.0.1:9999/scheduler",
                "filterVerb": "filter",
                "prioritizeVerb": "prioritize",
                "bindVerb": "bind",
                "weight": 1,
                "nodeCacheCapable": True,
                "ignorable": False,
                "httpTimeout": "3s",
                "managedResources": [{"name": "gpuloom.io/gpu", "ignoredByScheduler": True}],
            }
        ]
    }


def test_binaries_follow_the_environment(tmp_path: Path) -> None:
    assert binaries({"GPULOOM_K8S_BIN": str(tmp_path)}) is None
    for name in ("kube-apiserver", "kube-scheduler", "etcd"):
        (tmp_path / "bin" / name).parent.mkdir(exist_ok=True)
        (tmp_path / "bin" / name).write_text("#!/bin/sh\n")
        (tmp_path / "bin" / name).chmod(0o755)
    assert binaries({"GPULOOM_K8S_CACHE": str(tmp_path)}) == tmp_path / "bin"
    assert binaries({"GPULOOM_K8S_BIN": str(tmp_path / "bin")}) == tmp_path / "bin"


# -- a watch's refusals, from a stand-in server (1.20's watch cache grows to 100k events,
#    so a real 410 cannot be provoked in a test)


def stand_in(handler: Callable[[httpx.Request], httpx.Response]) -> KubeClient:
    config = KubeConfig(server="https://kube.test", token="t0ken")
    return KubeClient(config, transport=httpx.MockTransport(handler))


def lines(*events: Obj) -> bytes:
    return b"".join(json.dumps(e).encode() + b"\n" for e in events)


async def test_a_watch_streams_events_and_raises_gone_on_an_error_event_of_410() -> None:
    seen: list[httpx.Request] = []
    expired = {"kind": "Status", "code": 410, "reason": "Expired", "message": "too old: 1 (82)"}

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(
            200,
            content=lines(
                {"type": "ADDED", "object": {"metadata": {"name": "n1"}}},
                {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "90"}}},
                {"type": "ERROR", "object": expired},
            ),
        )

    async with stand_in(handler) as kube:
        got: list[tuple[str, Obj]] = []
        with pytest.raises(Gone) as caught:
            async for event in kube.watch("/api/v1/nodes", "7", timeout_s=30):
                got.append(event)
    assert [kind for kind, _ in got] == ["ADDED", "BOOKMARK"]
    assert caught.value.status == 410 and caught.value.reason == "Expired"
    params = dict(seen[0].url.params)
    assert params == {
        "watch": "1",
        "timeoutSeconds": "30",
        "allowWatchBookmarks": "true",
        "resourceVersion": "7",
    }
    assert seen[0].headers["Authorization"] == "Bearer t0ken"


async def test_a_watch_answered_410_raises_gone_and_other_errors_apierror() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v1/pods":
            return httpx.Response(410, json={"kind": "Status", "code": 410, "reason": "Gone"})
        if request.url.path == "/api/v1/nodes":
            return httpx.Response(
                200, content=lines({"type": "ERROR", "object": {"code": 500, "message": "x"}})
            )
        raise httpx.ConnectError("refused", request=request)

    async with stand_in(handler) as kube:
        with pytest.raises(Gone):
            async for _ in kube.watch("/api/v1/pods", "7"):
                pass
        with pytest.raises(ApiError) as caught:
            async for _ in kube.watch("/api/v1/nodes", "7"):
                pass
        assert type(caught.value) is ApiError and caught.value.status == 500
        with pytest.raises(Unreachable):
            await kube.get("/api/v1/namespaces")
        with pytest.raises(Unreachable):
            async for _ in kube.watch("/api/v1/services", None):
                pass

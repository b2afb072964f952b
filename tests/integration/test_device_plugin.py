"""The device plugin over real gRPC on unix sockets, with the test as the kubelet.

The test serves the kubelet's `Registration` on `kubelet.sock` (the generated stubs),
receives the plugin's Register, then calls the plugin on its socket as the kubelet
does: GetDevicePluginOptions, ListAndWatch, Allocate. No kubelet can run here, so the
Kubernetes API is pods kept in memory behind the plugin's `KubeApi` protocol.
"""

from __future__ import annotations

import asyncio
import copy
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest

from services.deviceplugin import api_pb2, api_pb2_grpc
from services.deviceplugin.devices import simulated_gpus
from services.deviceplugin.plugin import run_plugin
from services.deviceplugin.settings import PluginSettings

pytestmark = pytest.mark.integration

NODE = "gpu-node-1"
GPUS = 4
SPLIT = 10


class MemoryKube:
    """The plugin's Kubernetes API: pods in memory, merge patches applied to them."""

    def __init__(self, pods: list[dict[str, Any]]) -> None:
        self.pods = pods
        self.node_patches: list[tuple[str, dict[str, Any]]] = []
        self.selectors: list[str | None] = []

    async def list(
        self,
        path: str,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> tuple[list[dict[str, Any]], str]:
        assert path == "/api/v1/pods"
        self.selectors.append(field_selector)
        node = (field_selector or "").removeprefix("spec.nodeName=")
        items = [p for p in self.pods if p["spec"].get("nodeName") == node]
        return copy.deepcopy(items), "42"

    async def annotate_pod(
        self, namespace: str, name: str, annotations: Mapping[str, str | None]
    ) -> dict[str, Any]:
        for p in self.pods:
            meta = p["metadata"]
            if (meta["namespace"], meta["name"]) == (namespace, name):
                meta.setdefault("annotations", {}).update(annotations)
                return p
        raise LookupError(f"no pod {namespace}/{name}")

    async def patch_merge(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        self.node_patches.append((path, body))
        return {}


def placed_pod(name: str, gpus: int, indices: list[int], created: str) -> dict[str, Any]:
    """A pod gpuloom placed on NODE (annotated, bound) whose container waits to start."""
    return {
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "creationTimestamp": created,
            "annotations": {
                "gpuloom.io/node": NODE,
                "gpuloom.io/gpus": ",".join(str(i) for i in indices),
                "gpuloom.io/gpu-uuids": ",".join(f"GPU-sim-{NODE}-{i}" for i in indices),
                "gpuloom.io/job": f"job-{name}",
            },
        },
        "spec": {
            "nodeName": NODE,
            "containers": [
                {"name": "main", "resources": {"limits": {"gpuloom.io/gpu": str(gpus)}}}
            ],
        },
        "status": {"phase": "Pending"},
    }


class Kubelet(api_pb2_grpc.RegistrationServicer):  # type: ignore[misc]
    """The kubelet's Registration service: what plugins registered."""

    def __init__(self) -> None:
        self.registered: asyncio.Queue[api_pb2.RegisterRequest] = asyncio.Queue()

    async def Register(
        self, request: api_pb2.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.Empty:
        self.registered.put_nowait(request)
        return api_pb2.Empty()


@asynccontextmanager
async def kubelet_at(directory: Path) -> AsyncIterator[Kubelet]:
    """A kubelet's `kubelet.sock` in `directory` while the block runs; then it is gone."""
    socket = directory / "kubelet.sock"
    socket.unlink(missing_ok=True)
    kubelet = Kubelet()
    server = grpc.aio.server()
    api_pb2_grpc.add_RegistrationServicer_to_server(kubelet, server)
    server.add_insecure_port(f"unix://{socket}")
    await server.start()
    try:
        yield kubelet
    finally:
        await server.stop(None)
        socket.unlink(missing_ok=True)


@pytest.fixture
def plugin_dir() -> Iterator[Path]:
    """A short directory: a unix socket's path must stay under 108 bytes."""
    directory = Path(tempfile.mkdtemp(prefix="gpuloom-dp-", dir="/tmp"))
    yield directory
    shutil.rmtree(directory, ignore_errors=True)


@asynccontextmanager
async def running_plugin(directory: Path, kube: MemoryKube) -> AsyncIterator[None]:
    settings = PluginSettings(
        directory=directory, node=NODE, declared_gpus=GPUS, split=SPLIT, watch_s=0.05
    )
    stop = asyncio.Event()
    task = asyncio.create_task(run_plugin(settings, kube, simulated_gpus(NODE, GPUS), stop))
    try:
        yield
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


async def registration(kubelet: Kubelet) -> api_pb2.RegisterRequest:
    return await asyncio.wait_for(kubelet.registered.get(), 10)


async def first_devices(stub: Any) -> list[api_pb2.Device]:
    stream = stub.ListAndWatch(api_pb2.Empty())
    try:
        response = await asyncio.wait_for(stream.read(), 10)
    finally:
        stream.cancel()
    return list(response.devices)


async def test_the_kubelet_registers_lists_and_allocates_gpuloom_gpus(plugin_dir: Path) -> None:
    kube = MemoryKube(
        [
            placed_pod("train", 2, [2, 3], "2026-01-01T00:00:01Z"),
            placed_pod("later", 2, [0, 1], "2026-01-01T00:00:09Z"),
        ]
    )
    async with kubelet_at(plugin_dir) as kubelet, running_plugin(plugin_dir, kube):
        request = await registration(kubelet)
        assert (request.version, request.endpoint, request.resource_name) == (
            "v1beta1",
            "gpuloom-gpu.sock",
            "gpuloom.io/gpu",
        )

        async with grpc.aio.insecure_channel(f"unix://{plugin_dir / request.endpoint}") as ch:
            stub = api_pb2_grpc.DevicePluginStub(ch)
            options = await stub.GetDevicePluginOptions(api_pb2.Empty(), timeout=5)
            assert not options.pre_start_required

            devices = await first_devices(stub)
            assert len(devices) == GPUS * SPLIT
            assert {d.health for d in devices} == {"Healthy"}
            assert len({d.ID for d in devices}) == GPUS * SPLIT

            # the kubelet picks two device IDs of GPU 0; gpuloom placed the pod on GPUs 2, 3
            picked = [f"GPU-sim-{NODE}-0::0", f"GPU-sim-{NODE}-0::1"]
            answer = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=picked)]
                ),
                timeout=5,
            )

            (container,) = answer.container_responses
            envs = dict(container.envs)
            assert envs["NVIDIA_VISIBLE_DEVICES"] == f"GPU-sim-{NODE}-2,GPU-sim-{NODE}-3"
            assert envs["GPULOOM_GPUS"] == "2,3"
            assert envs["GPULOOM_JOB_ID"] == "job-train"
            assert not [v for v in envs.values() if f"GPU-sim-{NODE}-0" in v]
            assert kube.pods[0]["metadata"]["annotations"]["gpuloom.io/allocated"] == "main"
            assert "gpuloom.io/allocated" not in kube.pods[1]["metadata"]["annotations"]
            assert kube.selectors == [f"spec.nodeName={NODE}"]

            # the next Allocate of 2 is the younger pod's; then nobody waits
            answer = await stub.Allocate(
                api_pb2.AllocateRequest(
                    container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=picked)]
                ),
                timeout=5,
            )
            assert answer.container_responses[0].envs["GPULOOM_GPUS"] == "0,1"
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await stub.Allocate(
                    api_pb2.AllocateRequest(
                        container_requests=[api_pb2.ContainerAllocateRequest(devices_ids=picked)]
                    ),
                    timeout=5,
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert (
                f"no gpuloom-placed pod is waiting for 2 gpuloom.io/gpu on this node ({NODE})"
                in str(refused.value.details())
            )

    assert kube.node_patches == [
        (
            f"/api/v1/nodes/{NODE}",
            {
                "metadata": {
                    "annotations": {
                        "gpuloom.io/gpu-split": str(SPLIT),
                        "gpuloom.io/gpu-uuids": ",".join(
                            f"GPU-sim-{NODE}-{i}" for i in range(GPUS)
                        ),
                    }
                }
            },
        )
    ]
    assert not (plugin_dir / "gpuloom-gpu.sock").exists()  # removed on stop


async def test_the_plugin_registers_again_with_a_restarted_kubelet(plugin_dir: Path) -> None:
    kube = MemoryKube([])
    async with running_plugin(plugin_dir, kube):
        async with kubelet_at(plugin_dir) as kubelet:
            assert (await registration(kubelet)).resource_name == "gpuloom.io/gpu"
        # kubelet.sock is gone; a new kubelet makes it again: the plugin registers again
        async with kubelet_at(plugin_dir) as kubelet:
            assert (await registration(kubelet)).endpoint == "gpuloom-gpu.sock"

        # a restarting kubelet also empties the directory: the plugin serves again
        (plugin_dir / "gpuloom-gpu.sock").unlink()
        async with kubelet_at(plugin_dir) as kubelet:
            await registration(kubelet)
            async with grpc.aio.insecure_channel(f"unix://{plugin_dir / 'gpuloom-gpu.sock'}") as ch:
                devices = await first_devices(api_pb2_grpc.DevicePluginStub(ch))
            assert len(devices) == GPUS * SPLIT

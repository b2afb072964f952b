"""The kubelet device plugin (API v1beta1) that hands out the GPUs gpuloom chose.

The plugin serves `DevicePlugin` on `gpuloom-gpu.sock` in the kubelet's device-plugin
directory and registers `gpuloom.io/gpu` with the kubelet at `kubelet.sock` there. It
advertises each GPU as `split` device IDs, so the kubelet only counts. At `Allocate`
it finds the pod being started (`services.deviceplugin.allocation.choose_pod`), marks
it `gpuloom.io/allocated`, and answers the container's environment with gpuloom's GPUs:
the device IDs the kubelet picked are never used. A kubelet that restarts makes a new
`kubelet.sock` and removes the plugin's socket: the plugin serves again and registers
again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from gpuloom.kube.vocabulary import ALLOCATED, GPU_RESOURCE
from gpuloom.tasks import cancel_and_wait
from services.deviceplugin import api_pb2, api_pb2_grpc
from services.deviceplugin.allocation import Allocation, NoMatch, choose_pod
from services.deviceplugin.devices import (
    HEALTHY,
    UNHEALTHY,
    Gpu,
    device_ids,
    node_annotations,
    nvml_health,
)
from services.deviceplugin.kube import KubeApi, annotate_node, pods_on_node
from services.deviceplugin.settings import PluginSettings

log = logging.getLogger(__name__)

API_VERSION = "v1beta1"
SOCKET_NAME = "gpuloom-gpu.sock"
KUBELET_SOCKET = "kubelet.sock"
#: How long the kubelet may take to answer a registration.
REGISTER_TIMEOUT_S = 10.0
#: How long a stopping server lets its calls finish (ListAndWatch streams never do).
STOP_GRACE_S = 0.5


class Refused(Exception):
    """An `Allocate` the plugin cannot answer: the gRPC status and why."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def _pod_key(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return str(meta.get("uid") or f"{meta.get('namespace')}/{meta.get('name')}")


class GpuloomDevicePlugin(api_pb2_grpc.DevicePluginServicer):  # type: ignore[misc]
    """The `DevicePlugin` service of one node's GPUs."""

    def __init__(self, node: str, gpus: Sequence[Gpu], split: int, kube: KubeApi) -> None:
        self.node = node
        self.gpus = list(gpus)
        self._kube = kube
        self._devices = device_ids(self.gpus, split)
        self._healthy = {gpu.uuid: True for gpu in self.gpus}
        self._version = 0
        self._changed = asyncio.Condition()
        self._allocating = asyncio.Lock()
        #: Pods given GPUs by this process (by UID), in case a list still shows one
        #: without its `gpuloom.io/allocated` (or marking it failed).
        self._given: set[str] = set()

    # -- devices and health ---------------------------------------------------------------

    def devices(self) -> list[api_pb2.Device]:
        return [
            api_pb2.Device(ID=ident, health=HEALTHY if self._healthy[uuid] else UNHEALTHY)
            for ident, uuid in self._devices
        ]

    async def set_health(self, health: Mapping[str, bool]) -> None:
        """Take the GPUs' health (by UUID); the ListAndWatch streams send a new list when
        it changed."""
        changed = {u: ok for u, ok in health.items() if u in self._healthy}
        if all(self._healthy[u] == ok for u, ok in changed.items()):
            return
        for uuid, ok in changed.items():
            if self._healthy[uuid] != ok:
                log.warning("GPU %s is now %s", uuid, HEALTHY if ok else UNHEALTHY)
        self._healthy.update(changed)
        async with self._changed:
            self._version += 1
            self._changed.notify_all()

    # -- the DevicePlugin service -----------------------------------------------------------

    async def GetDevicePluginOptions(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> api_pb2.DevicePluginOptions:
        return api_pb2.DevicePluginOptions(
            pre_start_required=False, get_preferred_allocation_available=False
        )

    async def ListAndWatch(
        self, request: api_pb2.Empty, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[api_pb2.ListAndWatchResponse]:
        sent = -1
        while True:
            async with self._changed:
                while self._version == sent:
                    await self._changed.wait()
                sent = self._version
                response = api_pb2.ListAndWatchResponse(devices=self.devices())
            yield response

    async def GetPreferredAllocation(
        self, request: api_pb2.PreferredAllocationRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreferredAllocationResponse:
        """Not advertised (the device IDs are interchangeable: gpuloom picks the GPUs); a
        kubelet that asks anyway gets the ones it must take, then the first available."""
        answers = []
        for ask in request.container_requests:
            chosen = list(ask.must_include_deviceIDs)
            for ident in ask.available_deviceIDs:
                if len(chosen) >= ask.allocation_size:
                    break
                if ident not in chosen:
                    chosen.append(ident)
            answers.append(api_pb2.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return api_pb2.PreferredAllocationResponse(container_responses=answers)

    async def Allocate(
        self, request: api_pb2.AllocateRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.AllocateResponse:
        try:
            return await self.allocate(request)
        except Refused as refused:
            await context.abort(refused.code, refused.message)
            raise  # abort raises; this is never reached

    async def PreStartContainer(
        self, request: api_pb2.PreStartContainerRequest, context: grpc.aio.ServicerContext
    ) -> api_pb2.PreStartContainerResponse:
        return api_pb2.PreStartContainerResponse()

    # -- allocation -------------------------------------------------------------------------

    async def allocate(self, request: api_pb2.AllocateRequest) -> api_pb2.AllocateResponse:
        """The answer to `request`: for each container, gpuloom's GPUs of the pod it is
        for. Raises `Refused` when the pods cannot be read or none fits."""
        async with self._allocating:  # two calls must not both take the oldest pod
            try:
                pods = await pods_on_node(self._kube, self.node)
            except Exception as exc:
                raise Refused(
                    grpc.StatusCode.UNAVAILABLE,
                    f"cannot list the pods of node {self.node} from the Kubernetes API: {exc}",
                ) from exc
            self._given &= {_pod_key(p) for p in pods}  # forget the pods that are gone
            answers = []
            for ask in request.container_requests:
                waiting = [p for p in pods if _pod_key(p) not in self._given]
                found = choose_pod(waiting, len(ask.devices_ids), self.node)
                if isinstance(found, NoMatch):
                    log.warning("Allocate of %s refused: %s", list(ask.devices_ids), found.reason)
                    raise Refused(grpc.StatusCode.FAILED_PRECONDITION, found.reason)
                self._given.add(_pod_key(next(p for p in waiting if _is(p, found))))
                await self._mark(found)
                log.info(
                    "pod %s/%s (job %s) gets GPUs %s (the kubelet offered %s)",
                    found.namespace,
                    found.name,
                    found.placement.job_id,
                    found.envs["NVIDIA_VISIBLE_DEVICES"],
                    ",".join(ask.devices_ids),
                )
                answers.append(api_pb2.ContainerAllocateResponse(envs=found.envs))
            return api_pb2.AllocateResponse(container_responses=answers)

    async def _mark(self, found: Allocation) -> None:
        """Annotate the pod `gpuloom.io/allocated`. A failure is logged, not raised: the
        container gets its GPUs all the same, and this process remembers the pod."""
        try:
            await self._kube.annotate_pod(
                found.namespace, found.name, {ALLOCATED: found.allocated_value}
            )
        except Exception as exc:
            log.error("could not mark pod %s/%s allocated: %s", found.namespace, found.name, exc)


def _is(pod: Mapping[str, Any], found: Allocation) -> bool:
    meta = pod.get("metadata") or {}
    return bool(
        meta.get("name") == found.name and (meta.get("namespace") or "default") == found.namespace
    )


# -- registration and the server's life ------------------------------------------------------


async def register(directory: Path) -> None:
    """Register the plugin with the kubelet at `directory/kubelet.sock`."""
    async with grpc.aio.insecure_channel(f"unix://{directory / KUBELET_SOCKET}") as channel:
        await api_pb2_grpc.RegistrationStub(channel).Register(
            api_pb2.RegisterRequest(
                version=API_VERSION,
                endpoint=SOCKET_NAME,
                resource_name=GPU_RESOURCE,
                options=api_pb2.DevicePluginOptions(
                    pre_start_required=False, get_preferred_allocation_available=False
                ),
            ),
            timeout=REGISTER_TIMEOUT_S,
        )


async def start_server(plugin: GpuloomDevicePlugin, path: Path) -> grpc.aio.Server:
    """Serve `plugin` on the unix socket `path` (a stale socket file is replaced)."""
    path.unlink(missing_ok=True)
    server = grpc.aio.server()
    api_pb2_grpc.add_DevicePluginServicer_to_server(plugin, server)
    server.add_insecure_port(f"unix://{path}")
    await server.start()
    return server


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What tells a file from the next one made at the same path (None: no file)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, st.st_ctime_ns


async def _pause(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)


async def serve(
    plugin: GpuloomDevicePlugin, directory: Path, stop: asyncio.Event, watch_s: float
) -> None:
    """Serve `plugin` in `directory` and keep it registered with the kubelet until `stop`.

    Registers whenever a new `kubelet.sock` appears (a kubelet that restarted), and
    serves again on a fresh socket when its own was removed (a restarting kubelet
    empties the directory).
    """
    ours = directory / SOCKET_NAME
    kubelet = directory / KUBELET_SOCKET
    while not stop.is_set():
        server = await start_server(plugin, ours)
        served = _identity(ours)
        log.info("serving %s on %s (%d devices)", GPU_RESOURCE, ours, len(plugin.devices()))
        registered_with: tuple[int, int, int] | None = None
        try:
            while not stop.is_set():
                if _identity(ours) != served:
                    log.warning("%s was removed (the kubelet restarted?): serving again", ours)
                    break
                current = _identity(kubelet)
                if current is not None and current != registered_with:
                    try:
                        await register(directory)
                    except grpc.aio.AioRpcError as exc:
                        log.warning("registration with %s failed: %s", kubelet, exc.details())
                    else:
                        registered_with = current
                        log.info("registered %s with the kubelet at %s", GPU_RESOURCE, kubelet)
                await _pause(stop, watch_s)
        finally:
            await server.stop(STOP_GRACE_S)
    ours.unlink(missing_ok=True)


async def watch_health(plugin: GpuloomDevicePlugin, interval_s: float) -> None:
    """Ask NVML about the GPUs every `interval_s` (nothing to do where NVML is missing)."""
    uuids = [gpu.uuid for gpu in plugin.gpus]
    while True:
        health = await asyncio.to_thread(nvml_health, uuids)
        if health is None:
            log.info("NVML is not available: every GPU counts as healthy")
            return
        await plugin.set_health(health)
        await asyncio.sleep(interval_s)


async def describe_node(kube: KubeApi, node: str, notes: Mapping[str, str]) -> None:
    """Write `notes` on the Node, trying again (up to once a minute) until it works."""
    delay = 1.0
    while True:
        try:
            await annotate_node(kube, node, notes)
        except Exception as exc:
            log.warning("could not annotate node %s (again in %.0f s): %s", node, delay, exc)
            await asyncio.sleep(delay)
            delay = min(60.0, delay * 2)
        else:
            log.info("annotated node %s: %s", node, dict(notes))
            return


async def run_plugin(
    settings: PluginSettings, kube: KubeApi, gpus: Sequence[Gpu], stop: asyncio.Event
) -> None:
    """The plugin's whole life: serve, register, watch health, describe the node."""
    plugin = GpuloomDevicePlugin(settings.node, gpus, settings.split, kube)
    settings.directory.mkdir(parents=True, exist_ok=True)
    helpers = []
    if settings.declared_gpus is None and gpus:
        helpers.append(asyncio.create_task(watch_health(plugin, settings.health_s)))
    if settings.annotate_node:
        notes = node_annotations(gpus, settings.split, simulated=settings.declared_gpus is not None)
        helpers.append(asyncio.create_task(describe_node(kube, settings.node, notes)))
    try:
        await serve(plugin, settings.directory, stop, settings.watch_s)
    finally:
        await cancel_and_wait(*helpers)

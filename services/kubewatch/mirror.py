"""What the watcher has read of the Kubernetes API: the Nodes that offer
`gpuloom.io/gpu` and the pods that ask for it, kept current by a list and then a watch
of each (listed again when the watch's place is too old, or the API was away).

It only reads; `gpuloom.kube.watch` decides from it. Nothing is decided about nodes or
pods until they were listed in full once (`nodes`/`pods` None until then).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from gpuloom.kube.nodes import KubeNode, read_node
from gpuloom.kube.pods import Pod, read_pod
from gpuloom.kube.watch import PodsSeen
from gpuloom.kubeapi import ApiError, Gone, KubeClient, Unreachable

log = logging.getLogger(__name__)

#: Seconds between tries while the API does not answer.
RETRY_S = 1.0
#: Seconds a watch is asked to last before it is made again.
WATCH_S = 240.0


class Mirror:
    """The API's Nodes and pods, as far as gpuloom cares; `changed` is called after
    each change (the watcher's loop then decides again)."""

    def __init__(self, kube: KubeClient, changed: Callable[[], None]) -> None:
        self.kube = kube
        self.changed = changed
        self.nodes: dict[str, KubeNode] | None = None
        self._pods: dict[str, Pod] | None = None
        self._deleted: set[str] = set()
        self._listed_at: datetime | None = None

    def seen(self) -> PodsSeen | None:
        if self._pods is None:
            return None
        return PodsSeen(
            dict(self._pods), frozenset(self._deleted), self._listed_at, datetime.now(UTC)
        )

    def forget_deleted(self, keep: set[str]) -> None:
        """Drop the deleted pods no live job names any more (bounded by the live jobs)."""
        self._deleted &= keep

    async def run(self, stop: asyncio.Event) -> None:
        await asyncio.gather(
            self._follow("/api/v1/nodes", self._node_list, self._node_change, stop),
            self._follow("/api/v1/pods", self._pod_list, self._pod_change, stop),
        )

    async def _follow(
        self,
        path: str,
        listed: Callable[[list[dict[str, Any]]], None],
        change: Callable[[str, dict[str, Any]], None],
        stop: asyncio.Event,
    ) -> None:
        version: str | None = None
        while not stop.is_set():
            try:
                if version is None:
                    items, version = await self.kube.list(path)
                    listed(items)
                    self.changed()
                async with contextlib.aclosing(self.kube.watch(path, version, WATCH_S)) as events:
                    async for kind, obj in events:
                        version = (obj.get("metadata") or {}).get("resourceVersion") or version
                        if kind in ("ADDED", "MODIFIED", "DELETED"):
                            change(kind, obj)
                            self.changed()
            except Gone:
                version = None  # too old a place: list again
            except (ApiError, Unreachable) as exc:
                log.warning("watching %s: %s; again in %g s", path, exc, RETRY_S)
                version = None
                await _sleep(stop, RETRY_S)
            except Exception:  # a bug must not end the watch for good: list again
                log.exception("watching %s failed; listing again in %g s", path, RETRY_S)
                version = None
                await _sleep(stop, RETRY_S)

    def _node_list(self, items: list[dict[str, Any]]) -> None:
        nodes = {}
        for item in items:
            node = read_node(item)
            if node is not None:
                nodes[node.name] = node
        self.nodes = nodes

    def _node_change(self, kind: str, obj: dict[str, Any]) -> None:
        if self.nodes is None:
            return
        node = read_node(obj)
        name = str((obj.get("metadata") or {}).get("name") or "").replace(".", "_")
        if kind == "DELETED" or node is None:
            self.nodes.pop(name, None)
        else:
            self.nodes[node.name] = node

    def _pod_list(self, items: list[dict[str, Any]]) -> None:
        pods = {}
        for item in items:
            pod = read_pod(item)
            if pod is not None:
                pods[pod.uid] = pod
        if self._pods is not None:  # listed again: those gone meanwhile were deleted
            self._deleted |= set(self._pods) - set(pods)
        self._pods = pods
        self._listed_at = datetime.now(UTC)

    def _pod_change(self, kind: str, obj: dict[str, Any]) -> None:
        if self._pods is None:
            return
        pod = read_pod(obj)
        if pod is None:
            return
        if kind == "DELETED":
            self._pods.pop(pod.uid, None)
            self._deleted.add(pod.uid)
        else:
            self._pods[pod.uid] = pod


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), seconds)

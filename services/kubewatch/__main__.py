"""Composition root of the Kubernetes watcher (docs/kubernetes.md).

One process, its own bus identity: it may publish what the inventory publishes
(NodeRegistered, NodeLost, NodeRecovered), a cordon of its own, and for Kubernetes
nodes what an agent publishes (JobStarted, JobFinished) and a pod's cancel request,
and nothing else. It mirrors the API's Nodes and pods (`mirror.Mirror`) and runs the
same loop as every reactor on the folded state: `gpuloom.kube.watch.kube_round`
decides the events, and the API calls (annotate a placed pod, evict a preempted one,
delete one bound where its job no longer is) are made here, each at most once per few
seconds per pod while the round still asks for it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Sequence

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.events import Decision
from gpuloom.kube.watch import Action, Annotate, Delete, Evict, kube_round
from gpuloom.kubeapi import ApiError, KubeClient, KubeConfig, NotFound, Unreachable, pod_path
from gpuloom.runtime.reactor import Reactor
from gpuloom.runtime.service import run_service, snapshotter
from gpuloom.state import ClusterState
from gpuloom.telemetry.metrics import KUBE_ACTIONS
from services.kubewatch.mirror import Mirror

log = logging.getLogger(__name__)

#: Seconds the watcher's loop looks again with no new event (a pod bound, a node gone).
TICK_S = 0.2
#: Seconds before an API call on a pod is made again while the round still asks for it.
ACTION_AGAIN_S = 5.0
#: API calls in flight at most.
ACTIONS_AT_ONCE = 16
#: A node or pod the round skipped is logged once per this many seconds.
REPORT_EVERY_S = 60.0


class Actions:
    """The round's API calls, made in the background: each at most once per
    `ACTION_AGAIN_S` while asked for, at most `ACTIONS_AT_ONCE` at a time."""

    def __init__(self, kube: KubeClient) -> None:
        self.kube = kube
        self._made: dict[Action, float] = {}
        self._slots = asyncio.Semaphore(ACTIONS_AT_ONCE)
        self._tasks: set[asyncio.Task[None]] = set()

    def ask(self, actions: Sequence[Action]) -> None:
        now = time.monotonic()
        self._made = {a: t for a, t in self._made.items() if now - t < ACTION_AGAIN_S}
        for action in actions:
            if action in self._made:
                continue
            self._made[action] = now
            task = asyncio.ensure_future(self._make(action))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _make(self, action: Action) -> None:
        kind = type(action).__name__.lower()
        async with self._slots:
            try:
                if isinstance(action, Annotate):
                    notes = dict(action.annotations)
                    await self.kube.annotate_pod(action.namespace, action.name, notes)
                elif isinstance(action, Evict):
                    log.info("evicting pod %s/%s: %s", action.namespace, action.name, action.why)
                    await self.kube.evict_pod(action.namespace, action.name)
                elif isinstance(action, Delete):
                    log.info("deleting pod %s/%s: %s", action.namespace, action.name, action.why)
                    await self.kube.delete(pod_path(action.namespace, action.name))
            except NotFound:
                KUBE_ACTIONS.labels(kind, "gone").inc()
            except (ApiError, Unreachable) as exc:
                KUBE_ACTIONS.labels(kind, "refused").inc()
                log.warning("%s of pod %s/%s: %s", kind, action.namespace, action.name, exc)
            except Exception:
                KUBE_ACTIONS.labels(kind, "failed").inc()
                log.exception("%s of pod %s/%s failed", kind, action.namespace, action.name)
            else:
                KUBE_ACTIONS.labels(kind, "done").inc()

    async def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def kube_config(settings: Settings) -> KubeConfig:
    if settings.kubeconfig is not None:
        return KubeConfig.load(settings.kubeconfig)
    return KubeConfig.in_cluster()


async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
    async with KubeClient(kube_config(settings), user_agent="gpuloom-kubewatch") as kube:
        mirror = Mirror(kube, lambda: None)
        actions = Actions(kube)
        reported: dict[str, float] = {}

        async def decide(state: ClusterState) -> list[Decision]:
            found = kube_round(state, mirror.nodes, mirror.seen())
            now = time.monotonic()
            if len(reported) > 10_000:
                reported.clear()
            for name, why in found.skipped:
                if now - reported.get(name, -REPORT_EVERY_S) >= REPORT_EVERY_S:
                    reported[name] = now
                    log.warning("Kubernetes node or pod %s skipped: %s", name, why)
            actions.ask(found.actions)
            mirror.forget_deleted(
                {
                    j.spec.kubernetes.uid
                    for j in state.jobs.values()
                    if j.spec.kubernetes is not None and j.spec.kubernetes.uid
                }
            )
            return found.decisions

        reactor = Reactor(
            bus,
            "kubewatch",
            decide,
            tick_s=TICK_S,
            snapshots=snapshotter(settings, bus, "kubewatch"),
        )
        watching = asyncio.ensure_future(mirror.run(stop))
        try:
            await reactor.run(stop)
        finally:
            stop.set()
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await actions.close()


def entrypoint(argv: list[str] | None = None) -> None:
    run_service("kubewatch", main)


if __name__ == "__main__":
    entrypoint()

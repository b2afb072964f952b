"""The pods the extender keeps in mind between kube-scheduler's calls, and the members of
a gang, read from the API: bounded, oldest forgotten first."""

from __future__ import annotations

import time
from collections import OrderedDict

from gpuloom.kube.pods import Pod, read_pod
from gpuloom.kubeapi import KubeClient, NotFound, pod_path

#: How long a gang's member list read from the API serves later calls (seconds).
GANG_FRESH_S = 1.0


class PodMemory:
    """Pods by UID, as last seen in a filter call (a bind names only the pod: its
    annotations and its gang come from here, or from the API when forgotten)."""

    def __init__(self, kube: KubeClient, most: int) -> None:
        self.kube = kube
        self.most = most
        self._pods: OrderedDict[str, Pod] = OrderedDict()
        self._gangs: dict[tuple[str, str], tuple[float, list[str]]] = {}

    def remember(self, pod: Pod) -> None:
        self._pods[pod.uid] = pod
        self._pods.move_to_end(pod.uid)
        while len(self._pods) > self.most:
            self._pods.popitem(last=False)

    async def pod(self, namespace: str, name: str, uid: str) -> Pod | None:
        """The pod, from memory or the API (None: it is gone, or is another pod now)."""
        known = self._pods.get(uid)
        if known is not None:
            return known
        try:
            found = read_pod(await self.kube.get(pod_path(namespace, name)))
        except NotFound:
            return None
        if found is None or found.uid != uid:
            return None
        self.remember(found)
        return found

    async def exists(self, pod: Pod) -> bool:
        """Whether the API holds this very pod (its UID): the extender submits a job for
        a pod only once it read it there, so a caller on the extender's port that is not
        kube-scheduler cannot make jobs for pods that do not exist (in any namespace)."""
        try:
            found = await self.kube.get(pod_path(pod.namespace, pod.name))
        except NotFound:
            return False
        return str((found.get("metadata") or {}).get("uid") or "") == pod.uid

    async def gang(self, pod: Pod) -> list[str] | None:
        """The names of the pods of `pod`'s gang that exist now (None: not a gang)."""
        if pod.gang is None:
            return None
        key = (pod.namespace, pod.gang)
        now = time.monotonic()
        cached = self._gangs.get(key)
        if cached is not None and now - cached[0] < GANG_FRESH_S:
            return cached[1]
        items, _ = await self.kube.list(pod_path(pod.namespace))
        names = []
        for item in items:
            member = read_pod(item)
            if member is not None and member.job_key == pod.job_key and not member.deleting:
                names.append(member.name)
        if len(self._gangs) > self.most:
            self._gangs.clear()
        self._gangs[key] = (now, sorted(names))
        return sorted(names)

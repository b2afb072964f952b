"""What running jobs hold, when they will let go of it, and how to see the cluster then.

Backfill and preemption both ask "what if these jobs had ended?": they give a
job's resources back to the views (`engine.release`), look, and put them back
(`hold`, the exact inverse). They ask it on a `scratch` copy of the cycle's
index: every node they touch would otherwise be re-scored by every request
shape's heap of the cycle's own index afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from gpuloom.placement.engine import NodeIndex
from gpuloom.placement.resources import (
    GpuView,
    NodeView,
    ReplicaPlacement,
    give_back,
    give_back_host,
)


@dataclass(frozen=True, slots=True)
class Holding:
    """One job's placement as it stands, with what backfill and preemption need to know.

    `ends_at` is when the job will have let go at the latest (its start plus its
    time limit, or when it was told to stop), in the log's milliseconds since the
    epoch; None when it
    has no time limit. `preemptible` and `priority_class` say who may preempt it,
    `account` whether a quota may reclaim it; `order` is its start order (later
    starts are preempted first, since they lose the least work).
    """

    job_id: str
    replicas: tuple[ReplicaPlacement, ...]
    ends_at: int | None = None
    priority_class: int = 0
    preemptible: bool = False
    account: str = ""
    order: int = 0
    #: Already told to stop (preempted): not a victim again.
    stopping: bool = False
    #: The replicas' numbers in their job's attempt, in order (empty: 0, 1, ...).
    numbers: tuple[int, ...] = ()
    #: A running elastic gang: the replicas it keeps when it shrinks (its minimum); a
    #: preemption may take the others one by one (`placement.elastic`). 0: all or none.
    keep: int = 0
    #: Replicas of an elastic gang past its minimum: taking them shrinks it (JobShrunk).
    shrink: bool = False

    def number(self, position: int) -> int:
        """The number of the replica at `position`."""
        return self.numbers[position] if self.numbers else position

    def nodes(self) -> set[str]:
        held = {replica.host for replica in self.replicas}
        held.update(piece.node for replica in self.replicas for piece in replica.slices)
        return held

    @property
    def gpu_milli(self) -> int:
        return sum(piece.milli for replica in self.replicas for piece in replica.slices)


def scratch(index: NodeIndex) -> NodeIndex:
    """A copy of `index` (its views, not its heaps) to try things on."""
    return NodeIndex(copy_view(node) for node in index.nodes.values())


def copy_view(node: NodeView) -> NodeView:
    """A copy of `node` whose free resources can change without changing `node`'s."""
    return NodeView(
        node.name,
        node.rank,
        [
            GpuView(g.index, g.uuid, g.model, g.pool, g.memory_mib, g.milli_free, g.memory_free_mib)
            for g in node.gpus
        ],
        node.cpu_free_milli,
        node.memory_free_mib,
        node.labels,
        node.lends_remote_vgpu,
        node.runtimes,
        node.topology,
    )


def hold(index: NodeIndex, replica: ReplicaPlacement) -> None:
    """Take exactly what `replica` holds again (the inverse of `engine.release`)."""
    touched = set()
    for piece in replica.slices:
        node = index.nodes[piece.node]
        gpu = next(g for g in node.gpus if g.index == piece.index)
        gpu.milli_free -= piece.milli
        gpu.memory_free_mib -= piece.memory_mib
        node.forget()
        touched.add(node.name)
    host = index.nodes[replica.host]
    if host.cpu_free_milli is not None:
        host.cpu_free_milli -= replica.cpu_milli
    if host.memory_free_mib is not None:
        host.memory_free_mib -= replica.memory_mib
    host.forget()
    touched.add(host.name)
    for name in sorted(touched):
        index.update(index.nodes[name])


class HeldSum:
    """What many holdings hold, summed, kept up to date as holdings come and go.

    Why: the reservation search gives back the running jobs without a time limit in
    one group, and on a busy cluster that is nearly all of them (43,000 at 5,000
    nodes). Summed as they come and go, that group costs the nodes, not the jobs.

    A replica all on its host is summed into that node's totals (with a count, so a
    node whose replicas add up to nothing is still one they touch); a replica that
    spans nodes (remote vGPU) is kept whole, so that it is skipped whole when one of
    its nodes is not in the views, as `release_all` skips it.
    """

    def __init__(self) -> None:
        #: host -> [replicas, cpu, memory, {GPU index: [milli, memory]}]
        self.local: dict[str, list[Any]] = {}
        #: (job id, replica position) -> the replica, for replicas on several nodes
        self.spanning: dict[tuple[str, int], ReplicaPlacement] = {}

    def add(self, holding: Holding, sign: int = 1) -> None:
        """Sum `holding` in (`sign` -1: take it out again)."""
        for position, replica in enumerate(holding.replicas):
            host = replica.host
            if any(piece.node != host for piece in replica.slices):
                if sign > 0:
                    self.spanning[(holding.job_id, holding.number(position))] = replica
                else:
                    del self.spanning[(holding.job_id, holding.number(position))]
                continue
            total = self.local.get(host)
            if total is None:
                total = self.local[host] = [0, 0, 0, {}]
            total[0] += sign
            total[1] += sign * replica.cpu_milli
            total[2] += sign * replica.memory_mib
            gpus = total[3]
            for piece in replica.slices:
                gpu = gpus.get(piece.index)
                if gpu is None:
                    gpu = gpus[piece.index] = [0, 0]
                gpu[0] += sign * piece.milli
                gpu[1] += sign * piece.memory_mib
                if gpu == [0, 0]:
                    del gpus[piece.index]  # as if never held (slices hold milli > 0)
            if total[0] == 0:
                del self.local[host]  # its last replica left: everything summed is back to 0

    def remove(self, holding: Holding) -> None:
        self.add(holding, -1)

    def give_back_on(self, node: NodeView) -> bool:
        """Give `node` what the replicas summed on it hold; False when none is."""
        total = self.local.get(node.name)
        if total is None:
            return False
        _, cpu, memory, held = total
        give_back_host(node, cpu, memory)
        if held:
            for gpu in node.gpus:
                share = held.get(gpu.index)
                if share is not None:
                    gpu.milli_free += share[0]
                    gpu.memory_free_mib += share[1]
        return True


def release_all(
    index: NodeIndex, holdings: Iterable[Holding], summed: HeldSum | None = None
) -> set[str]:
    """Give back everything `holdings` (and `summed`) hold, on nodes the index has; the
    nodes touched.

    The same views as `engine.release` of each replica in turn, summed first: each GPU
    and host gets its total back once and each node is re-filed once. The reservation
    search gives back every running job of a busy cluster in one group (43,000 at
    5,000 nodes), once per cycle with a blocked job: `summed` gives most of them back
    at the cost of the nodes they are on.
    """
    nodes = index.nodes
    gpus: dict[tuple[str, int], list[int]] = {}
    hosts: dict[str, list[int]] = {}
    replicas = [replica for holding in holdings for replica in holding.replicas]
    touched = set()
    if summed is not None:  # sums add in any order: straight onto the views
        replicas += summed.spanning.values()
        for name in summed.local:
            node = nodes.get(name)
            if node is not None and summed.give_back_on(node):  # None: lost, not in the views
                touched.add(name)
    for replica in replicas:
        if replica.host not in nodes or any(p.node not in nodes for p in replica.slices):
            continue  # on a node that is not ready (lost): not in the views
        for piece in replica.slices:
            key = (piece.node, piece.index)
            total = gpus.get(key)
            if total is None:
                gpus[key] = [piece.milli, piece.memory_mib]
            else:
                total[0] += piece.milli
                total[1] += piece.memory_mib
        total = hosts.get(replica.host)
        if total is None:
            hosts[replica.host] = [replica.cpu_milli, replica.memory_mib]
        else:
            total[0] += replica.cpu_milli
            total[1] += replica.memory_mib
    for (name, number), (milli, memory) in gpus.items():
        give_back(nodes[name], number, milli, memory)
    for name, (cpu, memory) in hosts.items():
        give_back_host(nodes[name], cpu, memory)
    touched.update(name for name, _ in gpus)
    touched.update(hosts)
    for name in sorted(touched):
        index.update(nodes[name])
    return touched


def hold_all(index: NodeIndex, holdings: Iterable[Holding]) -> None:
    """Undo `release_all` (call with the same holdings, in reverse order for clarity)."""
    for holding in holdings:
        for replica in reversed(holding.replicas):
            if _on_index(index, replica):
                hold(index, replica)


def _on_index(index: NodeIndex, replica: ReplicaPlacement) -> bool:
    """A placement on a node that is not ready (lost) is not in the views: skip it."""
    return replica.host in index.nodes and all(p.node in index.nodes for p in replica.slices)

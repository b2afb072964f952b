"""The placement engine: one request, a policy, the nodes -> a placement or None.

The engine owns the rules every policy shares (feasibility, pools, locality,
gangs) and the total order of a decision: the highest integer score wins, ties
go to the lowest node rank. A policy only scores a feasible node and picks the
GPUs on the node it won.

`NodeIndex` keeps, per request shape, a heap of feasible nodes by (score, rank)
for a grouped policy (one whose score depends only on `NodeView.state_key` and
the request), and re-scores only the nodes a decision changed. That is what
makes a decision cheap both in the live service and in the trace simulator,
and it decides exactly as scoring every node would (property-tested).
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from gpuloom.placement.resources import (
    GpuView,
    NodeView,
    Placement,
    ReplicaPlacement,
    Request,
    fits_locally,
    give_back,
    give_back_host,
    host_fits,
    in_domain,
    serving_gpus,
    take,
    take_host,
)


@dataclass(frozen=True, slots=True)
class Context:
    """What a decision may depend on besides the nodes: a seed and its position.

    `seed` comes from the log (or the simulation's seed), `position` is the
    decision's index in its cycle, so a seeded policy draws the same numbers when
    the decision is replayed. `workload` is the typical-workload model of
    fragmentation-aware policies (`gpuloom.placement.fragmentation.Workload`).
    """

    seed: int = 0
    position: int = 0
    workload: Any = None


class Policy(Protocol):
    name: str
    version: int
    #: True when `score` depends only on `node.state_key()` and the request, so equal
    #: nodes may be scored once. A policy that looks at node names or ranks says False.
    grouped: bool
    #: The policy reads the typical workload (`Context.workload`): the placement cycle
    #: derives it from the log for such a policy only.
    needs_workload: bool
    #: ... and reads it again every this many submissions (1: at every one).
    workload_every: int

    @property
    def params(self) -> Mapping[str, Any]: ...

    def score(self, node: NodeView, request: Request, context: Context) -> int:
        """Integer score of a node that can host `request` (higher wins)."""
        ...

    def normalize(self, scores: list[int]) -> list[int]:
        """Rescale the scores of all feasible nodes (identity for most policies)."""
        ...

    def pick(self, node: NodeView, request: Request, context: Context) -> list[GpuView]:
        """The `request.gpus` GPUs of `node` that one replica takes (all serve it)."""
        ...


#: Heaps of shapes kept within one domain, per heap of a shape (`NodeIndex._domain_heaps`).
DOMAIN_HEAPS_PER_SHAPE = 16


class NodeIndex:
    """The nodes of one cycle or simulation, indexed for fast decisions.

    For a grouped policy (score a function of the node's state and the request)
    the index keeps, per request shape it has seen, a heap of the feasible
    nodes by (score, rank). A decision pops stale entries and takes the top;
    a heap re-scores only the nodes that changed since it was last asked (each
    once, however often it changed), so a shape asked rarely costs little, and
    files a node again only when its score moved.
    The result is the same as scoring every node (tested), at a cost that
    does not grow with the number of nodes.
    """

    def __init__(
        self,
        nodes: Iterable[NodeView],
        heap_shapes_limit: int = 512,
        groups_limit: int | None = None,
    ) -> None:
        self.nodes: dict[str, NodeView] = {}
        self._heaps: dict[tuple[object, ...], _ShapeHeap] = {}
        self._heap_shapes_limit = heap_shapes_limit
        #: Names of nodes in the order they changed; each heap catches up from its mark.
        self._changed: list[str] = []
        #: Per node, the position in `_changed` of its last change that may have freed
        #: something (any change not known to only take): a node that did not fit a shape
        #: still does not after changes that only took, so its heap need not look again.
        self._grown: dict[str, int] = {}
        #: Nodes whose view changed here since the owner last cleared it: a kept index's
        #: views that no longer show the folded state alone (`IndexCache.views_of`).
        self.touched: set[str] = set()
        #: Each node's group (its `state_key`, interned as a small int) until it changes:
        #: a heap scores a group once, however many nodes are in it.
        self._group: dict[str, int] = {}
        self._group_ids: dict[tuple[object, ...], int] = {}
        for node in nodes:
            self.nodes[node.name] = node
        #: (level, domain) -> the names of its nodes, per level asked (`members`).
        self._members: dict[str, dict[str, list[str]]] = {}
        #: Counts every change of a view (`update`): what was computed of the views at one
        #: version holds while it stands (`gpuloom.placement.topology.domain_room`).
        self.version = 0
        #: Such results, by what was asked; each with the version it was computed at.
        self.memo: dict[tuple[object, ...], tuple[int, object]] = {}
        #: Heaps of shapes kept within one domain (`Request.within`): each holds only that
        #: domain's nodes, and a topology request asks one per domain it tries, so they
        #: have a budget of their own, far larger than the shapes'.
        self._domain_heaps: dict[tuple[object, ...], _ShapeHeap] = {}
        #: Node states remembered at most (then forgotten, with the heaps' group scores):
        #: a kept index sees a new state at nearly every change, for months.
        self._groups_limit = groups_limit or max(10_000, 4 * len(self.nodes))

    def update(self, node: NodeView, *, only_took: bool = False) -> None:
        """Re-file `node` after its view changed (heaps re-score it when next asked).

        `only_took`: the change only took GPU share, GPU memory, CPU or memory from
        the node (nothing freed, nothing else changed), so no shape the node could
        not host before fits it now.
        """
        self.touched.add(node.name)
        self.version += 1
        if not only_took:
            self._grown[node.name] = len(self._changed)
        self._changed.append(node.name)
        self._group.pop(node.name, None)

    def replace(self, node: NodeView) -> None:
        """Put `node` (a fresh view of a node the index has) in place of the old view."""
        if node.topology != self.nodes[node.name].topology:
            self._members.clear()  # it moved (registered again elsewhere)
            self._domain_heaps.clear()
        self.nodes[node.name] = node
        self.update(node)

    def members(self, level: str, domain: str) -> list[str]:
        """The names of the nodes in `domain` of `level` (built once per level)."""
        return self.domains_of(level).get(domain, [])

    def domains_of(self, level: str) -> dict[str, list[str]]:
        """Every domain of `level` and the names of its nodes, by domain name."""
        found = self._members.get(level)
        if found is None:
            found = {}
            for name, node in self.nodes.items():
                place = node.topology.get(level)
                if place is not None:
                    found.setdefault(place, []).append(name)
            found = self._members[level] = dict(sorted(found.items()))
        return found

    @property
    def backlog(self) -> int:
        """Changes recorded since the last `compact` (what its heaps may still re-score)."""
        return len(self._changed)

    def compact(self) -> None:
        """Forget the change list and the heaps' stale entries, for an index kept long.

        A heap that would re-score more than half the nodes to catch up is dropped (it is
        rebuilt, for about the same cost, if its shape is asked again); every other heap
        catches up now and keeps only its current entries. Decisions are unchanged: each
        heap still holds exactly the feasible nodes at their current score.
        """
        for heaps in (self._heaps, self._domain_heaps):
            for key, heap in list(heaps.items()):
                if 2 * len(set(self._changed[heap.mark :])) > len(self.nodes):
                    del heaps[key]
                    continue
                self._catch_up(heap)
                current = heap.current
                heap.entries = [e for e in heap.entries if current.get(e[2]) is e]
                heapq.heapify(heap.entries)
                heap.mark = 0
        self._changed = []
        self._grown = {}

    def group_of(self, node: NodeView) -> int:
        """The node's group: nodes with equal `state_key`s share it (and every score)."""
        group = self._group.get(node.name)
        if group is None:
            key = node.state_key()
            group = self._group_ids.get(key)
            if group is None:
                if len(self._group_ids) >= self._groups_limit:
                    self._group_ids.clear()
                    self._group.clear()
                    for heap in [*self._heaps.values(), *self._domain_heaps.values()]:
                        heap.scores.clear()
                group = len(self._group_ids)
                self._group_ids[key] = group
            self._group[node.name] = group
        return group

    def best_local(self, request: Request, policy: Policy, context: Context) -> NodeView | None:
        """The node that hosts one replica entirely and scores best (ties: lowest rank)."""
        if not policy.grouped:
            hosts = [n for n in self.nodes.values() if fits_locally(request, n)]
            return best_host(request, hosts, policy, context)
        key = (id(policy), request.shape())
        within = request.within
        heaps, limit = self._heaps, self._heap_shapes_limit
        if within is not None:
            heaps, limit = self._domain_heaps, DOMAIN_HEAPS_PER_SHAPE * limit
        heap = heaps.get(key)
        if heap is not None and heap.context.workload is not context.workload:
            heap.rescore(self, context)
        if heap is None:
            if len(heaps) >= limit:
                heaps.clear()
            heap = _ShapeHeap(request, policy, context)
            heaps[key] = heap  # filed first: forgetting the node states clears its scores
            # a node outside the domain never fits the shape: only its members are offered
            heap.offer_each(self, self.nodes if within is None else self.members(*within))
            heap.mark = len(self._changed)
        elif heap.mark < len(self._changed):
            self._catch_up(heap)
        return heap.top(self)

    def _catch_up(self, heap: _ShapeHeap) -> None:
        """Offer `heap` each node changed since its mark, once, as it is now."""
        mark, grown, fitting = heap.mark, self._grown, heap.current
        heap.offer_each(
            self,
            [
                name
                for name in dict.fromkeys(self._changed[mark:])
                # a node that did not fit at the mark and has only given since still does not
                if name in fitting or grown.get(name, -1) >= mark
            ],
        )
        heap.mark = len(self._changed)

    def __len__(self) -> int:
        return len(self.nodes)


class _ShapeHeap:
    """Feasible nodes for one request shape, best first; stale entries are skipped."""

    def __init__(self, request: Request, policy: Policy, context: Context) -> None:
        self.request = request
        self.policy = policy
        self.context = context
        self.entries: list[tuple[int, int, str]] = []  # (-score, rank, name)
        self.mark = 0  # how much of the index's change list this heap has seen
        #: Score of each node group (`NodeIndex.group_of`); None: it does not fit there.
        self.scores: dict[int, int | None] = {}
        #: The live entry of each node that fitted when last offered; an entry in `entries`
        #: that is not its node's live one is stale. A node offered again with the same
        #: score and rank keeps its entry.
        self.current: dict[str, tuple[int, int, str]] = {}

    def offer_each(self, index: NodeIndex, names: Iterable[str]) -> None:
        """File each named node of `index` as it is now: in `entries` by its group's score
        (unless its live entry has that score already), or nowhere when the shape does not
        fit it. One loop with its names bound once: it runs for every node a decision
        changed, for every shape."""
        nodes, groups = index.nodes, index._group
        scores, entries, current = self.scores, self.entries, self.current
        request, context, score_of = self.request, self.context, self.policy.score
        push = heapq.heappush
        for name in names:
            node = nodes[name]
            group = groups.get(name)
            if group is None:
                group = index.group_of(node)  # may clear `scores` (in place)
            if group in scores:
                score = scores[group]
            else:
                score = scores[group] = (
                    score_of(node, request, context) if fits_locally(request, node) else None
                )
            if score is None:
                current.pop(name, None)
                continue
            entry = current.get(name)
            if entry is None or entry[0] != -score or entry[1] != node.rank:
                entry = current[name] = (-score, node.rank, name)
                push(entries, entry)

    def rescore(self, index: NodeIndex, context: Context) -> None:
        """Score again, with `context`'s typical workload, the nodes this heap holds now.

        Whether a node fits a shape does not depend on the workload, so the nodes that did
        not fit stay out (with their mark), and the heap is what one built at its mark with
        the new workload would be: a new workload costs the nodes that fit, not every node.
        """
        self.context = context
        self.scores.clear()
        fitting = list(self.current)
        self.entries, self.current = [], {}
        self.offer_each(index, fitting)

    def top(self, index: NodeIndex) -> NodeView | None:
        entries = self.entries
        current = self.current
        while entries:
            entry = entries[0]
            if current.get(entry[2]) is entry:
                return index.nodes[entry[2]]
            heapq.heappop(entries)
        return None


def best_host(
    request: Request, hosts: list[NodeView], policy: Policy, context: Context
) -> NodeView | None:
    """The host with the highest (normalised) score, ties to the lowest rank.

    Normalisation is monotone, so it never changes the winner; it is applied so
    that recorded scores are the policy's own.
    """
    if not hosts:
        return None
    scores = policy.normalize([policy.score(node, request, context) for node in hosts])
    best = max(range(len(hosts)), key=lambda i: (scores[i], -hosts[i].rank))
    return hosts[best]


def place_replica(
    request: Request, index: NodeIndex, policy: Policy, context: Context
) -> ReplicaPlacement | None:
    """Place one replica and apply it to the views; None when it cannot be placed."""
    host = index.best_local(request, policy, context)
    if host is not None:
        slices = tuple(take(host, gpu, request) for gpu in policy.pick(host, request, context))
        take_host(host, request)
        index.update(host, only_took=True)
        return ReplicaPlacement(host.name, slices, request.cpu_milli, request.memory_mib)
    if request.locality == "local-only" or request.gpus == 0 or request.pool == "physical":
        return None
    return _place_with_remote(request, index, policy, context)


def _place_with_remote(
    request: Request, index: NodeIndex, policy: Policy, context: Context
) -> ReplicaPlacement | None:
    """Remote vGPU: a host with room for the replica, slices from as few nodes as possible.

    Only vGPU slices travel; a host may use its own GPUs (any pool) and borrow the rest
    from lenders (in its domain, if kept within one), most serving GPUs first. Among hosts for which that adds up, the one
    with the most local slices wins, then the policy's score (when it has local
    slices to score), then rank.
    """
    everyone = sorted(index.nodes.values(), key=lambda n: n.rank)
    lendable = {
        n.name: sorted(
            (g for g in serving_gpus(request, n) if g.pool == "vgpu"),
            key=lambda g: (g.milli_free, g.index),
        )
        for n in everyone
        if n.lends_remote_vgpu and in_domain(request, n)
    }
    total_lendable = sum(len(gpus) for gpus in lendable.values())
    viable: list[tuple[NodeView, list[GpuView]]] = []
    for node in everyone:
        if not host_fits(request, node):
            continue
        local = serving_gpus(request, node)[: request.gpus]
        borrowable = total_lendable - len(lendable.get(node.name, []))
        if len(local) + borrowable >= request.gpus:
            viable.append((node, local))
    if not viable:
        return None
    most_local = max(len(local) for _, local in viable)
    finalists = [node for node, local in viable if len(local) == most_local]
    host = best_host(request, finalists, policy, context) if most_local else finalists[0]
    assert host is not None
    local = serving_gpus(request, host)[: request.gpus]
    needed = request.gpus - len(local)
    lenders = sorted(
        (index.nodes[name] for name in lendable if name != host.name),
        key=lambda n: (-len(lendable[n.name]), n.rank),
    )
    remote: list[tuple[NodeView, GpuView]] = []
    for lender in lenders:
        for gpu in lendable[lender.name]:
            if needed == 0:
                break
            remote.append((lender, gpu))
            needed -= 1
    if needed:
        return None
    slices = [take(host, gpu, request) for gpu in local]
    slices += [take(lender, gpu, request) for lender, gpu in remote]
    take_host(host, request)
    for node in {host.name: host, **{n.name: n for n, _ in remote}}.values():
        index.update(node, only_took=True)
    return ReplicaPlacement(host.name, tuple(slices), request.cpu_milli, request.memory_mib)


def release(index: NodeIndex, replica: ReplicaPlacement) -> None:
    """Give back what `replica` took (undoes `place_replica` exactly)."""
    touched: dict[str, NodeView] = {}
    for piece in replica.slices:
        node = index.nodes[piece.node]
        give_back(node, piece.index, piece.milli, piece.memory_mib)
        touched[node.name] = node
    host = index.nodes[replica.host]
    give_back_host(host, replica.cpu_milli, replica.memory_mib)
    touched[host.name] = host
    for node in touched.values():
        index.update(node)


def place(request: Request, index: NodeIndex, policy: Policy, context: Context) -> Placement | None:
    """Place all replicas of `request` (a gang: all or none) and apply them to `index`."""
    replicas: list[ReplicaPlacement] = []
    for _ in range(request.replicas):
        replica = place_replica(request, index, policy, context)
        if replica is None:
            for placed in reversed(replicas):
                release(index, placed)
            return None
        replicas.append(replica)
    return Placement(tuple(replicas))

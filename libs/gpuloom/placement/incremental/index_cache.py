"""One placement cycle's node index kept for the next, so its heaps are not rebuilt.

A cycle builds fresh views of the nodes from the folded state. Building a
`NodeIndex` on them costs, per request shape the cycle meets, a score of every
node: at 5,000 nodes that was most of a cycle. Between two cycles few nodes
change (those the last cycle placed on, which the kept index has already
applied, and those where jobs ended or nodes came and went), so the kept index
takes the fresh view only of each node whose view differs, and its heaps
re-score just those.

The result is exactly that of a fresh index: a node's score is a function of its
view, every view that differs is replaced (and re-filed), and the heaps are
dropped when the policy object changes. When the typical workload changes (compared
by value; an equal one is replaced by the kept object), each heap asked again scores
the nodes it holds with the new one (`_ShapeHeap.rescore`): whether a node fits does
not depend on the workload, so on a full cluster that is few nodes. A long-kept index is
compacted (`NodeIndex.compact`) so that what it remembers stays bounded. Tests hold
`placement_cycle` with a kept index to the same decisions as without one.

Nor are the views built again for nodes that did not change (`views_of`): the change
feed knows the last event that changed each node (`ChangeFeed.node_changed_at`), so a
kept view is re-used while that is the one it was built after and no decision of the
index changed it since (`NodeIndex.touched`).
A full cluster in its steady state changes a few nodes between two cycles, and
building the views of all 5,000 was a fifth of such a cycle.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuloom.events import JobSpec
from gpuloom.placement.engine import Context, NodeIndex, Policy
from gpuloom.placement.fences import fences_of
from gpuloom.placement.fragmentation import Workload
from gpuloom.placement.holdings import Holding
from gpuloom.placement.incremental.candidates import KeptCandidates
from gpuloom.placement.incremental.holdings import KeptHoldings
from gpuloom.placement.incremental.queue import KeptQueue
from gpuloom.placement.incremental.released import KeptReleased
from gpuloom.placement.inputs import (
    candidates,
    context_for,
    current_reservation,
    growable_of,
    log_ms,
    node_view,
    node_views,
    schedulable,
    schedulable_gpu_models,
    typical_shapes,
    workload_specs,
)
from gpuloom.placement.resources import NodeView
from gpuloom.placement.scarcity import with_scarcity
from gpuloom.placement.scheduling import PassInputs
from gpuloom.queueing.order import quota_book
from gpuloom.state import ClusterState
from gpuloom.state.changes import ChangeFeed

#: Compact the kept index once it has recorded this many changes per node: bounds the
#: heaps' stale entries and the change list of a service that runs for months.
CHANGES_PER_NODE = 2


class IndexCache:
    """Keeps the `NodeIndex` of the last cycle (for one policy) between cycles; learns
    what the log changed from `changes`, which must be fed every event the states it
    is asked about fold (it reads everything again otherwise)."""

    def __init__(self, changes: ChangeFeed) -> None:
        self.changes = changes
        self._index: NodeIndex | None = None
        self._policy: Policy | None = None
        self._workload: object = None
        #: What `views_of` last read: the state and its `seq`, every node's name in rank
        #: order, and the last change of each node (`node_changed_at`) its view is after.
        self._state: ClusterState | None = None
        self._seq = -1
        self._names: list[str] = []
        self._built_at: dict[str, int] = {}
        #: What running jobs hold, kept as well (`KeptHoldings`).
        self.holdings = KeptHoldings(changes)
        #: The views with everything running given back (`KeptReleased`).
        self._released = KeptReleased()
        #: The queue's order (`KeptQueue`), and its jobs' candidates (`KeptCandidates`).
        self.queue = KeptQueue(changes)
        self.candidates = KeptCandidates()
        #: The specs the typical workload was last read from, and their shapes counted.
        self._reading: tuple[list[JobSpec], Workload] | None = None

    def pass_inputs(self, state: ClusterState, policy: Policy) -> PassInputs | None:
        """`gpuloom.placement.inputs.pass_inputs(state, policy)`, from what is kept: the
        same inputs (tests hold the decisions made with them to the reference pass's),
        re-read only where the log changed since the last cycle."""
        views = self.views_of(state)
        if not views:
            return None
        context = self.context_for(state, policy)
        index, workload = self.index_for(views, policy, context.workload)
        holdings, made = self.holdings, self.candidates
        made.prune(state)
        order = self.queue.order(state)
        return PassInputs(
            candidates=candidates(state, order, holdings.awaiting(state), made.of),
            index=index,
            context=Context(context.seed, 0, workload),
            now=log_ms(state),
            holdings=lambda: holdings.of(state),  # built only if a job is blocked
            quotas=quota_book(state),
            current=current_reservation(state),
            fences=fences_of(state),
            by_end=lambda: holdings.by_end(state),
            released=lambda placed: self.released(state, placed),
            growable=lambda: growable_of(state),
        )

    def views_of(self, state: ClusterState) -> list[NodeView]:
        """`node_views(state)`, with the kept index's view of each node that changed
        neither in the log (`ChangeFeed.node_changed_at`) nor in the index since it
        was built."""
        names, changes = sorted(state.nodes), self.changes
        index, seen = self._index, self._seq
        self._seq = state.seq
        if (
            index is None
            or state is not self._state
            or names != self._names
            or not changes.covers(state, seen)
        ):
            self._state, self._names = state, names
            self._released.forget()
            views = node_views(state)
            self._built_at = {view.name: changes.node_changed_at(view.name) for view in views}
            return views
        kept, touched, built_at = index.nodes, index.touched, self._built_at
        views = []
        for rank, name in enumerate(names):
            node = state.nodes[name]
            if not schedulable(node):
                continue
            view = kept.get(name)
            changed_at = changes.node_changed_at(name)
            if view is None or name in touched or built_at.get(name) != changed_at:
                view = node_view(node, rank)
                built_at[name] = changed_at
                self._released.moved.add(name)
            views.append(view)
        return views

    def context_for(self, state: ClusterState, policy: Policy) -> Context:
        """`context_for(state, policy, 0)`, counting the shapes of the typical workload
        again only when the specs it is read from are not those of the last reading:
        they change once per `policy.workload_every` submissions, and a full cluster's
        cycles come more often (counting 1,000 specs was a few percent of such a cycle)."""
        if not policy.needs_workload:
            return context_for(state, policy, 0)
        specs = workload_specs(state, policy.workload_every)
        last = self._reading
        if (
            last is None
            or len(last[0]) != len(specs)
            or any(was is not spec for was, spec in zip(last[0], specs, strict=True))
        ):
            last = self._reading = (specs, typical_shapes(specs))
        workload = with_scarcity(last[1], schedulable_gpu_models(state))
        return Context(seed=state.seq, position=0, workload=workload)

    def index_for(
        self, views: list[NodeView], policy: Policy, workload: object
    ) -> tuple[NodeIndex, object]:
        """An index equal to `NodeIndex(views)`, and the workload to decide with: `workload`,
        or the kept one when they are equal."""
        index = self._index
        if (
            index is None
            or policy is not self._policy
            or len(views) != len(index.nodes)
            or any(view.name not in index.nodes for view in views)
        ):
            self._index = NodeIndex(views)
            self._policy = policy
            self._workload = workload
            self._released.forget()
            return self._index, workload
        if workload != self._workload:
            # a heap asked again scores the nodes it holds with this one (`_ShapeHeap.rescore`)
            self._workload = workload
        for view in views:
            held = index.nodes[view.name]
            if held is not view and held != view:
                index.replace(view)
                self._released.moved.add(view.name)
        index.touched.clear()  # every view it holds now is as `views_of` would build it
        if index.backlog > CHANGES_PER_NODE * len(views):
            index.compact()
        return index, self._workload

    def released(self, state: ClusterState, placed: Iterable[Holding] = ()) -> NodeIndex | None:
        """The kept index's views, as they stand, with every running job of `state` and
        `placed` (this pass's placements) given back (`KeptReleased`); None when there is
        no kept index, or while a replica spans nodes."""
        if self._index is None:
            return None
        return self._released.of(self._index, self.holdings.everything(state), placed)

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
dropped whenever what scores depend on besides the view changes: the policy
object, or the typical workload (compared by value; an equal one is replaced by
the kept object, so the heaps keyed on it stay valid). A long-kept index is
compacted (`NodeIndex.compact`) so that what it remembers stays bounded. Tests hold
`placement_cycle` with a kept index to the same decisions as without one.
"""

from __future__ import annotations

from gpuloom.placement.engine import NodeIndex, Policy
from gpuloom.placement.resources import NodeView

#: Compact the kept index once it has recorded this many changes per node: bounds the
#: heaps' stale entries and the change list of a service that runs for months.
CHANGES_PER_NODE = 2


class IndexCache:
    """Keeps the `NodeIndex` of the last cycle (for one policy) between cycles."""

    def __init__(self) -> None:
        self._index: NodeIndex | None = None
        self._policy: Policy | None = None
        self._workload: object = None

    def index_for(
        self, views: list[NodeView], policy: Policy, workload: object
    ) -> tuple[NodeIndex, object]:
        """An index equal to `NodeIndex(views)`, and the workload to decide with: `workload`,
        or the kept one when they are equal."""
        index = self._index
        if (
            index is None
            or policy is not self._policy
            or workload != self._workload
            or len(views) != len(index.nodes)
            or any(view.name not in index.nodes for view in views)
        ):
            self._index = NodeIndex(views)
            self._policy = policy
            self._workload = workload
            return self._index, workload
        for view in views:
            if index.nodes[view.name] != view:
                index.replace(view)
        if index.backlog > CHANGES_PER_NODE * len(views):
            index.compact()
        return index, self._workload

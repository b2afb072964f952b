"""The views as they will be once every running job has ended, kept from cycle to cycle.

Why: a blocked job's reservation search lets running jobs end in the order of their
time limits, those without one last, and asks where the job would fit after each
step. After the last step everything running is gone. On a busy cluster where no job
has a limit, the last step is the only one, and it cost, every cycle, a copy of every
view, every holding given back and a heap over every node for the blocked job.

A node's view plus what is held on it does not change when a job is placed there or
ends there (one takes what the other gives back); only when the node itself changes
(it registers again, a GPU moves to another pool) or leaves the views. So that index
is kept, heaps and all, and a node's sum is made again only when the kept node index
(`IndexCache`) built or replaced its view since the last search (`moved`).

Exact: each view is what `release_all` of every holding makes of a copy of the view
(the same sums); tests compare it with that after every event, and the reservations
found with it with those found without. A replica that spans nodes (remote vGPU) is
given back whole or not at all (not when one of its nodes is out of the views), which
a sum per node cannot say: while any runs, nothing is kept and the search copies the
views as before.
"""

from __future__ import annotations

from collections.abc import Iterable

from gpuloom.placement.engine import NodeIndex
from gpuloom.placement.holdings import HeldSum, Holding, copy_view
from gpuloom.placement.resources import NodeView


class KeptReleased:
    """The index of every view with everything running given back (see the module doc)."""

    def __init__(self) -> None:
        self.index: NodeIndex | None = None
        #: Nodes whose view was built or replaced since the sums were last made.
        self.moved: set[str] = set()

    def forget(self) -> None:
        """Start afresh at the next search (the kept node index was made anew)."""
        self.index = None
        self.moved.clear()

    def of(
        self, views: NodeIndex, everything: HeldSum, placed: Iterable[Holding]
    ) -> NodeIndex | None:
        """`views` (the pass's index, as it stands) with `everything` (what every running
        job holds, summed) and `placed` (what this pass placed) given back; None while a
        replica spans nodes. The caller gives back what it takes from it."""
        extra = HeldSum()
        for holding in placed:
            extra.add(holding)
        if everything.spanning or extra.spanning:
            self.forget()
            return None
        kept = self.index
        if kept is None or kept.nodes.keys() != views.nodes.keys():
            kept = self.index = NodeIndex(
                released_view(view, everything, extra) for view in views.nodes.values()
            )
        else:
            for name in sorted(self.moved):
                view = views.nodes.get(name)
                if view is None:
                    continue
                fresh = released_view(view, everything, extra)
                if fresh != kept.nodes[name]:
                    kept.replace(fresh)
            if kept.backlog > 2 * len(kept):
                kept.compact()
        self.moved.clear()
        return kept


def released_view(view: NodeView, *sums: HeldSum) -> NodeView:
    """A copy of `view` with what `sums` hold on it given back (as `release_all` does)."""
    released = copy_view(view)
    for summed in sums:
        summed.give_back_on(released)
    return released

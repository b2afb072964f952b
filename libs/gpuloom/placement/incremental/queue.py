"""The queue's order kept from one placement cycle to the next.

With plain priorities (no age, fair-share or size weight: `priority_weights(...).plain`)
a queued job's place is its own `queue_key`: its priority, its fair-queuing tag and its
submission order, which change only with an event about the job, as does whether it is
queued (and with the policy's `fair_queuing`, when it is sorted afresh). The change feed
knows which jobs each event changed (`ChangeFeed.jobs_since`). So a cycle re-files only
the jobs changed since it last looked: a full cluster keeps a backlog of thousands, and
sorting all of it again was a fifth of a cycle in its steady state (docs/benchmarks.md).
Weighted priorities move with the clock and with usage: the queue is then ranked afresh.
What may be placed now (not being cancelled, dependencies met) is asked at every cycle,
as `queue_order` does; the order is `queue_order`'s (tests hold the two equal after every
event of random logs).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterator

from gpuloom.queueing.order import (
    QueueKey,
    fair_queuing,
    placeable_in_turn,
    priority_weights,
    queue_key,
    queue_order,
)
from gpuloom.state import ClusterState, JobState
from gpuloom.state.changes import ChangeFeed

_Key = tuple[QueueKey, str]


class KeptQueue:
    """`queue_order(state)`, with the queued jobs kept sorted between calls."""

    def __init__(self, changes: ChangeFeed) -> None:
        self.changes = changes
        self._state: ClusterState | None = None
        self._seq = -1  # the state's `seq` when last refreshed
        #: Each queued job's (queue_key, job id), and all of them in ascending order.
        self._keys: dict[str, _Key] = {}
        self._sorted: list[_Key] = []
        self._fair = False

    def order(self, state: ClusterState) -> Iterator[JobState]:
        """`queue_order(state)`, one job at a time as the placement pass asks for them
        (`placeable_in_turn`): read it before `state` or this queue changes."""
        if not priority_weights(state).plain:
            self._state = None  # ranked afresh; when plain again, sorted afresh
            return iter(queue_order(state))
        self._refresh(state)
        jobs = state.jobs
        return placeable_in_turn(state, (jobs[job_id] for _, job_id in self._sorted))

    def _refresh(self, state: ClusterState) -> None:
        if state is self._state and state.seq == self._seq:
            return
        keys, fair = self._keys, fair_queuing(state)
        if (
            state is not self._state
            or not self.changes.covers(state, self._seq)
            or fair != self._fair
        ):  # a new state, changes the feed does not know, or another policy
            self._state, self._fair = state, fair
            keys = self._keys = {j: (queue_key(state.jobs[j], fair), j) for j in state.queued}
            self._sorted = sorted(keys.values())
        else:
            left: list[_Key] = []  # the old places of jobs changed since
            added: list[_Key] = []
            for job_id in self.changes.jobs_since(self._seq):
                old = keys.pop(job_id, None)
                if old is not None:
                    left.append(old)
                if job_id in state.queued:
                    key = keys[job_id] = (queue_key(state.jobs[job_id], fair), job_id)
                    added.append(key)
            self._sorted = _edited(self._sorted, left, added)
        self._seq = state.seq


#: Up to this many keys are taken out or put in one by one (a binary search each);
#: more, and the list is filtered or sorted once (a placement cycle takes thousands
#: of jobs out at once, a steady one a few).
_ONE_BY_ONE = 32


def _edited(ordered: list[_Key], left: list[_Key], added: list[_Key]) -> list[_Key]:
    """`ordered` (ascending, distinct keys) without the keys `left` (each in it), with
    `added`: in ascending order, as sorting the result afresh would give it."""
    if len(left) <= _ONE_BY_ONE:
        for key in left:
            at = bisect_left(ordered, key)
            assert ordered[at] == key, f"{key} is not in the kept order"  # never a neighbour
            del ordered[at]
    else:
        gone = set(left)
        ordered = [key for key in ordered if key not in gone]
    if len(added) <= _ONE_BY_ONE:
        for key in added:
            insort(ordered, key)
    else:
        ordered += added
        ordered.sort()
    return ordered

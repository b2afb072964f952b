"""The queue's order kept from one placement cycle to the next.

With plain priorities (no age, fair-share or size weight: `priority_weights(...).plain`)
a queued job's place is its own `queue_key`: its priority and submission order, which
change only with an event about the job, as does whether it is queued. Every such event
moves the job to the end of the fold's `ClusterState.job_feed`. So a cycle re-files only
the jobs fed since it last looked: a full cluster keeps a backlog of thousands, and
sorting all of it again was a fifth of a cycle in its steady state (docs/benchmarks.md).
Weighted priorities move with the clock and with usage: the queue is then ranked afresh.
What may be placed now (not being cancelled, dependencies met) is asked at every cycle,
as `queue_order` does; the order is `queue_order`'s (tests hold the two equal after every
event of random logs).
"""

from __future__ import annotations

from gpuloom.queueing.order import placeable, priority_weights, queue_key, queue_order
from gpuloom.state import ClusterState, JobState

_Key = tuple[tuple[int, tuple[int, int, str]], str]


class KeptQueue:
    """`queue_order(state)`, with the queued jobs kept sorted between calls."""

    def __init__(self) -> None:
        self._state: ClusterState | None = None
        self._seq = -1  # the state's `seq` when last refreshed
        #: Each queued job's (queue_key, job id), and all of them in ascending order.
        self._keys: dict[str, _Key] = {}
        self._sorted: list[_Key] = []

    def order(self, state: ClusterState) -> list[JobState]:
        """`queue_order(state)`."""
        if not priority_weights(state).plain:
            self._state = None  # ranked afresh; when plain again, sorted afresh
            return queue_order(state)
        self._refresh(state)
        jobs = state.jobs
        return placeable(state, [jobs[job_id] for _, job_id in self._sorted])

    def _refresh(self, state: ClusterState) -> None:
        if state is self._state and state.seq == self._seq:
            return
        keys = self._keys
        if state is not self._state or state.feed_trimmed > self._seq:
            # a new state, or a job left the feed that this cache never saw leave
            self._state = state
            keys = self._keys = {j: (queue_key(state.jobs[j]), j) for j in state.queued}
            self._sorted = sorted(keys.values())
        else:
            left: set[str] = set()  # jobs whose old place goes
            added: list[_Key] = []
            for job_id, seq in reversed(state.job_feed.items()):
                if seq <= self._seq:
                    break
                if keys.pop(job_id, None) is not None:
                    left.add(job_id)
                if job_id in state.queued:
                    key = keys[job_id] = (queue_key(state.jobs[job_id]), job_id)
                    added.append(key)
            # one pass, and one sort of a sorted run and the few added (a placement
            # cycle takes thousands of jobs out at once, a steady one a few)
            if left:
                self._sorted = [key for key in self._sorted if key[1] not in left]
            if added:
                self._sorted += added
                self._sorted.sort()
        self._seq = state.seq

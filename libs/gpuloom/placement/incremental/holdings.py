"""What placed and running jobs hold, kept from one placement cycle to the next."""

from __future__ import annotations

from collections.abc import Iterable

from gpuloom.placement.holdings import HeldSum, Holding
from gpuloom.placement.inputs import (
    began_of,
    holding_of,
    on_a_node,
    placement_order,
    stopping_for,
)
from gpuloom.state import ClusterState
from gpuloom.state.changes import ChangeFeed


class KeptHoldings:
    """`holdings_of(state)`, kept from one cycle to the next.

    A job's holding changes only with an event that changes the job, and the change
    feed knows which jobs each event changed (`ChangeFeed.jobs_since`). So a cycle
    reads only the jobs changed since it last looked, re-makes their holdings, and keeps the
    rest where they stand in placement order: a full cluster holds tens of thousands
    of running jobs, and building and sorting all their holdings was a fifth of a
    cycle with a blocked job. What it keeps is also split for the reservation search
    (`by_end`), and the jobs whose victims are still stopping are known (`awaiting`).
    """

    def __init__(self, changes: ChangeFeed) -> None:
        self.changes = changes
        self._state: ClusterState | None = None
        self._seq = -1  # the state's `seq` when last refreshed
        #: job id -> (the job's `last_seq` when its holding was made, the holding)
        self._held: dict[str, tuple[int, Holding]] = {}
        #: The holdings in placement order (`placement_order`), by job.
        self._ordered: dict[str, Holding] = {}
        #: The holdings with an end (`ends_at`), by job, and the sum of those without.
        self._timed: dict[str, Holding] = {}
        self._unbounded = HeldSum()
        #: All of them summed (`gpuloom.placement.incremental.released`).
        self._everything = HeldSum()
        #: Preempted jobs still on a node -> the job they were preempted for.
        self._preempted_for: dict[str, str] = {}

    def of(self, state: ClusterState) -> list[Holding]:
        """`holdings_of(state)`."""
        self._refresh(state)
        return list(self._ordered.values())

    def by_end(self, state: ClusterState) -> tuple[list[Holding], HeldSum]:
        """The same holdings split for the reservation search: those with an end (in no
        particular order), and the sum of those without one (do not change it)."""
        self._refresh(state)
        return list(self._timed.values()), self._unbounded

    def everything(self, state: ClusterState) -> HeldSum:
        """The sum of every holding (do not change it)."""
        self._refresh(state)
        return self._everything

    def awaiting(self, state: ClusterState) -> frozenset[str]:
        """The jobs that preempted a job still on a node (they wait for it to stop)."""
        self._refresh(state)
        return frozenset(self._preempted_for.values())

    def _refresh(self, state: ClusterState) -> None:
        if state is self._state and state.seq == self._seq:
            return  # nothing folded since (a pass asks up to three times)
        if state is not self._state or not self.changes.covers(state, self._seq):
            # a new state, or changes the feed does not know (module doc)
            self._state, self._held, self._ordered = state, {}, {}
            self._timed, self._unbounded, self._preempted_for = {}, HeldSum(), {}
            self._everything = HeldSum()
            changed: Iterable[str] = {j for jobs in state.on_node.values() for j in jobs}
        else:
            changed = self.changes.jobs_since(self._seq)
        self._seq = state.seq
        jobs, held, ordered = state.jobs, self._held, self._ordered
        added = []
        for job_id in changed:
            job = jobs.get(job_id)
            on = job is not None and on_a_node(state, job)
            entry = held.get(job_id)
            if entry is not None:
                if on and job is not None and job.last_seq == entry[0]:
                    continue
                del held[job_id]
                self._file(job_id, entry[1], None, -1)
                if not on:
                    del ordered[job_id]
                    continue
            elif not on:
                continue
            assert job is not None
            holding = holding_of(state, job, began_of(job))
            held[job_id] = (job.last_seq, holding)
            self._file(job_id, holding, stopping_for(job), 1)
            if entry is not None and entry[1].order == holding.order:
                ordered[job_id] = holding  # where it stood: its place in the order is as it was
            else:
                if entry is not None:
                    del ordered[job_id]
                added.append(holding)
        if not added:
            return
        added.sort(key=placement_order)
        last = next(reversed(ordered.values()), None)
        if last is not None and placement_order(added[0]) < placement_order(last):
            every = sorted([*ordered.values(), *added], key=placement_order)
            self._ordered = {holding.job_id: holding for holding in every}
        else:
            ordered.update((holding.job_id, holding) for holding in added)

    def _file(self, job_id: str, holding: Holding, preempted_for: str | None, sign: int) -> None:
        self._everything.add(holding, sign)
        if holding.ends_at is None:
            self._unbounded.add(holding, sign)
        elif sign > 0:
            self._timed[job_id] = holding
        else:
            del self._timed[job_id]
        if sign < 0:
            self._preempted_for.pop(job_id, None)
        elif preempted_for is not None:
            self._preempted_for[job_id] = preempted_for

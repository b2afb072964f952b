"""What the log changed, event by event: for caches kept outside the state.

A placement cycle on a full cluster re-reads only what changed since the last one:
the views of the nodes an event touched, the holdings and queue places of the jobs it
touched (`gpuloom.placement.incremental`); the dispatcher routes only the jobs that
changed. The fold says what each event changed (`Folded.jobs`, `Folded.nodes`); a
`ChangeFeed` remembers it, fed by whoever folds (the log follower, as one of its
observers, or `ChangeFeed.apply`), so the state itself carries no stamps for caches.

A cache asks whether the feed knows every change since it last looked (`covers`): not
when the feed was fed from later on (a process restored a snapshot, or a cache was
made for another state) or has trimmed what it remembers, nor when something folded
into the state without telling the feed. The cache then reads everything again, so a
mistake costs time, never a stale decision.
"""

from __future__ import annotations

from collections.abc import Sequence

from gpuloom.events import Recorded
from gpuloom.state.fold import Folded, apply
from gpuloom.state.model import ClusterState


class ChangeFeed:
    """The jobs and nodes the folded events changed, and when each changed last."""

    #: Jobs remembered at most; past it the oldest half is forgotten (a cache that
    #: looked before then reads everything again). Caches look every cycle, so they
    #: are far fewer events behind than this.
    MOST_JOBS = 100_000

    def __init__(self, most_jobs: int = MOST_JOBS) -> None:
        self.most_jobs = most_jobs
        #: The sequence of the last event seen (0: none yet).
        self.seq = 0
        #: Every change after this sequence is known (the one before the first event seen).
        self.since = 0
        #: Job id -> the sequence of the last event that changed it, oldest first.
        self._jobs: dict[str, int] = {}
        #: Node name -> the sequence of the last event that changed it.
        self._nodes: dict[str, int] = {}

    def saw(self, seq: int, folded: Folded) -> None:
        """The event at `seq` was folded, and changed what `folded` says."""
        if not self.seq:
            self.since = seq - 1
        jobs = self._jobs
        for job_id in folded.jobs:
            jobs.pop(job_id, None)
            jobs[job_id] = seq
        for name in folded.nodes:
            self._nodes[name] = seq
        self.seq = seq
        if len(jobs) > self.most_jobs:
            self._trim()

    def apply(self, state: ClusterState, recorded: Recorded) -> Folded:
        """`apply(state, recorded)`, remembering what it changed."""
        folded = apply(state, recorded)
        self.saw(recorded.seq, folded)
        return folded

    def fold(self, state: ClusterState, records: Sequence[Recorded]) -> ClusterState:
        for recorded in records:
            self.apply(state, recorded)
        return state

    # --- as a fold observer of the log follower -------------------------------------

    def before(self, recorded: Recorded) -> None:
        pass

    def after(self, message: object, recorded: Recorded, folded: Folded) -> None:
        self.saw(recorded.seq, folded)

    # --- what caches ask --------------------------------------------------------------

    def covers(self, state: ClusterState, seq: int) -> bool:
        """The feed knows every change `state` folded after `seq`."""
        return self.since <= seq and self.seq == state.seq

    def jobs_since(self, seq: int) -> list[str]:
        """The jobs an event after `seq` changed, newest first (ask `covers` first)."""
        changed = []
        for job_id, changed_at in reversed(self._jobs.items()):
            if changed_at <= seq:
                break
            changed.append(job_id)
        return changed

    def node_changed_at(self, name: str) -> int:
        """The sequence of the last event that changed the node (0: none the feed saw)."""
        return self._nodes.get(name, 0)

    def _trim(self) -> None:
        jobs = self._jobs
        drop = len(jobs) - self.most_jobs // 2
        for job_id in list(jobs)[:drop]:
            self.since = max(self.since, jobs.pop(job_id))

"""Queued jobs' candidates, kept from one placement cycle to the next."""

from __future__ import annotations

from gpuloom.events import JobSpec
from gpuloom.placement.candidate import Candidate
from gpuloom.placement.inputs import candidate_of
from gpuloom.state import ClusterState, JobState


class KeptCandidates:
    """`candidate_of`, remembered per job until what it says changes: the job's spec
    (a new object), whether it awaits its victims, or whether its priority class lets
    it preempt. Every cycle walks the queue, and a job waits through many cycles."""

    #: Candidates of jobs no longer queued are dropped once there are this many more
    #: than queued jobs (amortised: the queue's own size bounds what is kept).
    SLACK = 1024

    def __init__(self) -> None:
        self._made: dict[str, tuple[JobSpec, bool, bool, Candidate]] = {}

    def of(self, job: JobState, awaiting: frozenset[str], may_preempt: bool) -> Candidate:
        spec, waits = job.spec, job.job_id in awaiting
        made = self._made.get(job.job_id)
        if made is not None and made[0] is spec and made[1] == waits and made[2] == may_preempt:
            return made[3]
        candidate = candidate_of(job, awaiting, may_preempt)
        self._made[job.job_id] = (spec, waits, may_preempt, candidate)
        return candidate

    def prune(self, state: ClusterState) -> None:
        """Forget the candidates of jobs that left the queue, when they are many."""
        queued = state.queued
        if len(self._made) > 2 * len(queued) + self.SLACK:
            self._made = {j: made for j, made in self._made.items() if j in queued}

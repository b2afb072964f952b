"""A queued job's candidate is remembered by the fast twin (`KeptCandidates`), and made
again whenever what it says changes: the spec, whether the job awaits its victims, and
whether its priority class lets it preempt."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuloom.placement.incremental.candidates import KeptCandidates
from gpuloom.placement.inputs import candidate_of
from gpuloom.state import ClusterState, JobState
from gpuloom.testing.builders import make_job_spec

AT = datetime(2026, 12, 5, tzinfo=UTC)
NONE: frozenset[str] = frozenset()


def test_a_remembered_candidate_follows_the_job() -> None:
    job, kept = JobState("j1", make_job_spec(2), "queued", AT, 1), KeptCandidates()
    first = kept.of(job, NONE, True)
    assert kept.of(job, NONE, True) is first, "remembered while nothing changed"
    assert first == candidate_of(job)
    assert (first.request.gpus, first.awaiting_victims, first.may_preempt) == (2, False, True)
    assert kept.of(job, frozenset({"j1"}), True).awaiting_victims
    assert not kept.of(job, frozenset({"other"}), True).awaiting_victims, "its victims ended"
    assert not kept.of(job, NONE, False).may_preempt
    assert kept.of(job, NONE, True).may_preempt, "its class may preempt again"
    job.spec = make_job_spec(4)
    assert kept.of(job, NONE, True).request.gpus == 4, "a new spec"


def test_candidates_of_jobs_that_left_the_queue_are_forgotten() -> None:
    kept, state = KeptCandidates(), ClusterState()
    kept.SLACK = 2
    for i in range(10):
        kept.of(JobState(f"j{i}", make_job_spec(1), "queued", AT, 1), NONE, True)
    state.queued.add("j3")
    kept.prune(state)
    assert list(kept._made) == ["j3"]

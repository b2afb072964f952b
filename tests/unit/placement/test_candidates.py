"""A queued job's candidate is remembered with the job (`candidate_of`), and made again
whenever what it says changes: the spec, whether the job awaits its victims, and whether
its priority class lets it preempt."""

from __future__ import annotations

from datetime import UTC, datetime

from gpuloom.placement.inputs import candidate_of
from gpuloom.state import JobState
from gpuloom.testing.builders import make_job_spec

AT = datetime(2026, 12, 5, tzinfo=UTC)


def test_a_remembered_candidate_follows_the_job() -> None:
    job = JobState("j1", make_job_spec(2), "queued", AT, 1)
    first = candidate_of(job)
    assert candidate_of(job) is first, "remembered while nothing changed"
    assert (first.request.gpus, first.awaiting_victims, first.may_preempt) == (2, False, True)
    assert candidate_of(job, frozenset({"j1"})).awaiting_victims
    assert not candidate_of(job, frozenset({"other"})).awaiting_victims, "its victims ended"
    assert not candidate_of(job, may_preempt=False).may_preempt
    assert candidate_of(job).may_preempt, "its class may preempt again"
    job.spec = make_job_spec(4)
    assert candidate_of(job).request.gpus == 4, "a new spec"

"""Dependencies between jobs: held until met, cancelled when they never can be."""

from __future__ import annotations

from gpuloom.decide.admission import decide_admission
from gpuloom.decide.queueing import decide_queue
from gpuloom.events import Dependency, JobAdmitted, JobCancelled, JobRejected
from gpuloom.queueing.order import queue_order
from gpuloom.state.dependencies import dependency_status
from gpuloom.state.retention import final_phase
from gpuloom.store.rows import job_row
from gpuloom.testing.builders import LogBuilder, make_job_spec


def scene() -> LogBuilder:
    log = LogBuilder()
    log.register("n1", 4)
    log.run_to_queue("first", gpus=1)
    return log


def after(job: str, when: str = "succeeded") -> list[Dependency]:
    return [Dependency(job=job, when=when)]  # type: ignore[arg-type]


def test_a_job_waits_for_its_dependency_then_runs() -> None:
    log = scene()
    log.run_to_queue("second", gpus=1, depends_on=after("first"))
    state = log.state()
    assert dependency_status(state, state.jobs["second"].spec.depends_on) == (
        "waiting",
        "Dependency: waiting for first to succeed",
    )
    assert [j.job_id for j in queue_order(state)] == ["first"]
    assert (
        job_row(state.jobs["second"], state)["reason"] == "Dependency: waiting for first to succeed"
    )
    log.place("first", "n1", [0])
    log.start("first", "n1")
    log.finish("first", "n1", outcome="succeeded")
    state = log.state()
    assert dependency_status(state, state.jobs["second"].spec.depends_on) == ("met", None)
    assert [j.job_id for j in queue_order(state)] == ["second"]
    assert job_row(state.jobs["second"], state)["reason"] is None


def test_a_failed_dependency_cancels_the_job_and_finished_accepts_any_end() -> None:
    log = scene()
    log.run_to_queue("needs-success", gpus=1, depends_on=after("first"))
    log.run_to_queue("needs-end", gpus=1, depends_on=after("first", "finished"))
    log.place("first", "n1", [0])
    log.start("first", "n1")
    log.finish("first", "n1", outcome="failed", exit_code=1)
    state = log.state()
    decisions = decide_queue(state)
    cancelled = [d.event for d in decisions if isinstance(d.event, JobCancelled)]
    assert [e.job_id for e in cancelled] == ["needs-success"]
    assert cancelled[0].reason.startswith("DependencyNeverSatisfied: dependency first ended failed")
    assert [j.job_id for j in queue_order(state)] == ["needs-end"]
    log.record_decisions(decisions)
    assert final_phase(log.state(), "needs-success") == "cancelled"


def test_admission_rejects_a_dependency_that_cannot_be_met() -> None:
    log = scene()
    log.submit("ghost", make_job_spec(1, depends_on=after("nobody")))
    log.place("first", "n1", [0])
    log.start("first", "n1")
    log.finish("first", "n1", outcome="failed", exit_code=2)
    log.submit("late", make_job_spec(1, depends_on=after("first")))
    log.submit("fine", make_job_spec(1, depends_on=after("first", "finished")))
    answers = {d.event.job_id: d.event for d in decide_admission(log.state())}
    assert isinstance(answers["ghost"], JobRejected)
    assert answers["ghost"].reason.startswith("depends on unknown job nobody (never submitted")
    assert isinstance(answers["late"], JobRejected)
    assert "ended failed, not succeeded" in answers["late"].reason
    assert isinstance(answers["fine"], JobAdmitted)

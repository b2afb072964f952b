"""Dependencies between jobs: held until met, cancelled when they never can be."""

from __future__ import annotations

from gpuloom.decide.admission import decide_admission
from gpuloom.decide.queueing import decide_queue
from gpuloom.events import Dependency, JobAdmitted, JobArraySubmitted, JobCancelled, JobRejected
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


def test_a_dependency_on_an_array_waits_for_every_task() -> None:
    """`--dependency afterok:<array id>` as sbatch users type it: the job waits while any
    task runs, starts once all succeeded; `afterany` once all ended; a failed task makes
    `afterok` never met. The read model's reason follows each task."""
    log = LogBuilder()
    log.register("n1", 4)
    log.append(JobArraySubmitted(job_id="arr", spec=make_job_spec(1, array=2)))
    log.append(JobAdmitted(job_id="arr"))
    log.record_decisions(decide_queue(log.state()))
    log.run_to_queue("ok", gpus=1, depends_on=after("arr"))
    log.run_to_queue("any", gpus=1, depends_on=after("arr", "finished"))
    state = log.state()
    assert dependency_status(state, state.jobs["ok"].spec.depends_on) == (
        "waiting",
        "Dependency: waiting for array arr to succeed (2 task(s) left)",
    )
    for index, outcome in ((0, "succeeded"), (1, "failed")):
        task = f"arr-{index}"
        log.place(task, "n1", [index])
        log.start(task, "n1")
        log.finish(task, "n1", outcome=outcome)
        state = log.state()
        if index == 0:
            assert "(1 task(s) left)" in str(job_row(state.jobs["ok"], state)["reason"])
    assert dependency_status(state, state.jobs["any"].spec.depends_on) == ("met", None)
    status, why = dependency_status(state, state.jobs["ok"].spec.depends_on)
    assert status == "never" and "task arr-1 ended failed" in str(why)
    cancelled = [d.event for d in decide_queue(state) if isinstance(d.event, JobCancelled)]
    assert [c.job_id for c in cancelled] == ["ok"]

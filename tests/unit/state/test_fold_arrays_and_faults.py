"""Issue #9 in the pure core: a job array is one event, accepted whole; the fold voids
whatever it cannot apply, faults included, and the contract refuses what storage,
the bus or `exec` cannot hold."""

from __future__ import annotations

import dataclasses
import importlib
from datetime import UTC, datetime, timedelta

import orjson
import pytest
from fixtures.checks import apply_expecting_void, check_invariants
from pydantic import ValidationError

from gpuloom.bus.deadletters import excerpt_of
from gpuloom.decide.admission import decide_admission
from gpuloom.decide.queueing import decide_queue
from gpuloom.events import (
    JobAdmitted,
    JobArraySubmitted,
    JobCancelled,
    JobCancelRequested,
    JobRejected,
    JobSpec,
    JobSubmitted,
    MalformedEvent,
    Recorded,
    decode,
    encode,
    make_envelope,
)
from gpuloom.queueing.order import pending_in_order
from gpuloom.state import apply, fold
from gpuloom.state.retention import final_phase
from gpuloom.testing.builders import LogBuilder, make_job_spec


def array_log(tasks: int = 12, key: str | None = "sweep") -> LogBuilder:
    log = LogBuilder()
    log.register("n1", 4, "A100-80GB")
    log.append(
        JobArraySubmitted(
            job_id="arr", spec=make_job_spec(gpus=0, array=tasks), idempotency_key=key
        )
    )
    return log


def test_an_array_event_makes_every_task_with_its_index() -> None:
    state = array_log().state()
    assert state.voided == 0, state.recent_voided
    assert state.array_tasks("arr") == [f"arr-{i}" for i in range(12)]
    for index, task in enumerate(state.array_tasks("arr")):
        job = state.jobs[task]
        assert (job.array_id, job.array_index, job.phase) == ("arr", index, "submitted")
        assert job.spec.array is None, "a task is one job, not an array"
    assert state.idempotency_keys == {"sweep": "arr"}
    check_invariants(state, 2)


def test_tasks_go_by_index_not_by_the_text_of_their_id() -> None:
    """`arr-10` sorts before `arr-2` as text; the queue must still take task 2 first."""
    log = array_log()
    state = log.state()
    # the array's waiting tasks are answered with one event on the array's id
    assert [d.event.job_id for d in decide_admission(state)] == ["arr"]
    log.record_decisions(decide_admission(state))
    state = log.state()
    assert {state.jobs[task].phase for task in state.array_tasks("arr")} == {"admitted"}
    [queued] = decide_queue(state)
    assert queued.event.job_id == "arr"
    log.record_decisions([queued])
    state = log.state()
    order = [job.job_id for job, _ in pending_in_order(state)]
    assert order == [f"arr-{i}" for i in range(12)]
    tags = [state.jobs[f"arr-{i}"].queue_tag for i in range(12)]
    assert tags == list(range(1, 13)), "tagged by index: the fair queue keeps their order"


def test_an_answer_to_an_array_covers_its_waiting_tasks_and_no_other() -> None:
    """A cancelled task stays cancelled; a second answer with no task left is voided."""
    log = array_log()
    log.append(JobCancelled(job_id="arr-3"))
    log.append(JobAdmitted(job_id="arr"))
    state = log.state()
    phases = [final_phase(state, task) for task in state.array_tasks("arr")]  # ended: forgotten
    assert phases == ["admitted"] * 3 + ["cancelled"] + ["admitted"] * 8
    log.append(JobAdmitted(job_id="arr"))
    state = log.state()
    assert "no task of array arr is submitted" in state.recent_voided[-1].reason


@pytest.mark.parametrize(
    ("first", "why"),
    [
        (JobSubmitted(job_id="arr", spec=make_job_spec()), "already submitted"),
        (JobSubmitted(job_id="arr-3", spec=make_job_spec()), "task arr-3 already submitted"),
        (
            JobSubmitted(job_id="other", spec=make_job_spec(), idempotency_key="sweep"),
            "idempotency key already used",
        ),
    ],
    ids=["the array id is taken", "a task id is taken", "the key is taken"],
)
def test_an_array_that_cannot_be_whole_is_voided_whole(first: JobSubmitted, why: str) -> None:
    log = LogBuilder()
    log.append(first)
    state = log.state()
    array = JobArraySubmitted(
        job_id="arr", spec=make_job_spec(gpus=0, array=5), idempotency_key="sweep"
    )
    apply_expecting_void(state, log.append(array), why)


def test_the_array_id_cancels_every_task_that_has_not_ended() -> None:
    log = array_log(tasks=3)
    log.reject("arr-1")  # ended before the cancel: left alone
    log.record_decisions(decide_admission(log.state()))
    log.append(JobCancelRequested(job_id="arr"))
    state = log.state()
    assert "arr-1" in state.tombstones  # rejected: ended and forgotten
    assert [state.jobs[t].cancel_requested for t in ("arr-0", "arr-2")] == [True, True]
    assert state.cancel_pending == {"arr-0", "arr-2"}
    for task in ("arr-0", "arr-2"):
        log.cancel(task)
    again = log.append(JobCancelRequested(job_id="arr"))
    apply_expecting_void(log.state(upto=len(log) - 1), again, "every task of array arr")


def test_array_task_ids_must_stay_subject_tokens() -> None:
    with pytest.raises(ValidationError, match="too long"):
        JobArraySubmitted(job_id="a" * 60, spec=make_job_spec(array=10_000))
    with pytest.raises(ValidationError, match=r"spec\.array"):
        JobArraySubmitted(job_id="arr", spec=make_job_spec())


def test_a_rule_that_fails_unexpectedly_voids_its_event_as_a_fault(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Containment: whatever the exception, the event is voided and counted, and the
    fold goes on; before, one TypeError crash-looped every service at every replay."""
    log = LogBuilder()
    log.register("n1", 1, "A100-80GB")
    state = log.state()

    def broken(*args: object) -> None:
        raise TypeError("can't compare offset-naive and offset-aware datetimes")

    fold_module = importlib.import_module("gpuloom.state.fold")  # `fold` is also a function
    handlers = dict(fold_module._HANDLERS)
    handlers[JobSubmitted] = broken
    monkeypatch.setattr(fold_module, "_HANDLERS", handlers)
    apply(state, log.append(JobSubmitted(job_id="j1", spec=make_job_spec())))
    assert (state.voided, state.faults) == (1, 1)
    last = state.recent_voided[-1]
    assert last.fault and "TypeError" in last.reason
    monkeypatch.undo()
    apply(state, log.append(JobSubmitted(job_id="j2", spec=make_job_spec())))
    assert "j2" in state.jobs and state.faults == 1


def test_an_event_whose_time_has_no_zone_is_malformed_on_the_wire_and_void_in_the_fold() -> None:
    event = JobSubmitted(job_id="j1", spec=make_job_spec())
    envelope = make_envelope(event, at=datetime(2026, 12, 3, 10, 0, tzinfo=UTC), by="x")
    doc = orjson.loads(encode(envelope))
    doc["at"] = "2026-12-03T10:00:00"
    with pytest.raises(MalformedEvent, match="timezone"):
        decode(5, orjson.dumps(doc))
    naive = envelope.model_copy(update={"at": datetime(2026, 12, 3, 10, 0)})
    state = fold([])
    apply(state, Recorded(5, naive, event))
    assert state.voided == 1 and "time zone" in state.recent_voided[-1].reason
    assert state.clock is None and state.jobs == {}


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("env", {"A": "x\x00"}),
        ("env", {"A=B": "x"}),
        ("command", ["sh", "\x00"]),
        ("name", "line\nbreak"),
        ("name", "bidi\u202eoverride"),
        ("user", "two words"),
        ("gpu_model", ["M" * 101]),
        ("time_limit_s", 2**31),
        ("cpu_milli", 2**31),
        ("node_selector", {"zone": "a\x07"}),
        ("account", "a*"),
    ],
)
def test_the_contract_refuses_what_storage_the_bus_or_exec_cannot_hold(
    field: str, value: object
) -> None:
    with pytest.raises(ValidationError) as caught:
        make_job_spec(**{field: value})  # type: ignore[arg-type]
    assert caught.value.errors()[0]["loc"][0] == field


def test_multi_line_scripts_and_unicode_names_are_still_fine() -> None:
    spec = make_job_spec(
        name="entraînement 🚀",
        command=["sh", "-c", "echo a\n\techo b"],
        env={"SCRIPT": "line 1\nline 2"},
        time_limit_s=2**31 - 1,
    )
    assert spec.time_limit_s == 2**31 - 1
    assert spec.env["SCRIPT"] == "line 1\nline 2"


def test_admission_judges_each_job_on_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A job no rule foresaw is rejected with the reason; the jobs after it are admitted."""
    admission = importlib.import_module("gpuloom.decide.admission")
    real = admission.rejection_reason

    def fragile(state: object, spec: JobSpec) -> str | None:
        if spec.name == "poison":
            raise OverflowError("date value out of range")
        return real(state, spec)

    monkeypatch.setattr(admission, "rejection_reason", fragile)
    log = LogBuilder()
    log.register("n1", 2, "A100-80GB")
    log.submit("bad", spec=make_job_spec(name="poison", gpus=2))
    log.submit("good", spec=make_job_spec(gpus=1))
    answers = {d.event.job_id: d.event for d in decide_admission(log.state())}
    assert isinstance(answers["good"], JobAdmitted)
    bad = answers["bad"]
    assert isinstance(bad, JobRejected) and "OverflowError" in bad.reason


def test_an_event_far_from_when_the_log_stored_it_keeps_its_fact_with_a_bounded_time() -> None:
    """A forged `at` in year 9999 would move the log's clock (ageing, decay,
    reservations) by millennia, and a drifting host's facts are still facts: the time
    is bounded by the log's own timestamp, counted, and the event applied."""
    log = LogBuilder()
    recorded = log.submit("j1")
    stored = recorded.envelope.at
    state = fold([])
    far = dataclasses.replace(recorded, stored_at=stored - timedelta(hours=1))
    apply(state, far)
    assert state.voided == 0 and state.skewed == 1
    assert state.jobs["j1"].submitted_at == stored - timedelta(hours=1) + timedelta(minutes=5)
    assert "from when the log stored it" in state.recent_skewed[-1].reason
    assert state.clock == stored - timedelta(minutes=55)
    near = log.submit("j2")
    apply(state, dataclasses.replace(near, stored_at=near.envelope.at + timedelta(seconds=30)))
    assert state.skewed == 1 and state.jobs["j2"].submitted_at == near.envelope.at


def test_dead_letters_never_show_a_jobs_environment() -> None:
    body = encode(
        make_envelope(
            JobSubmitted(job_id="j1", spec=make_job_spec(env={"TOKEN": "s3cret"})),
            at=datetime(2026, 12, 3, tzinfo=UTC),
            by="x",
        )
    )
    excerpt, _ = excerpt_of(body)
    assert "s3cret" not in excerpt and "TOKEN" in excerpt
    assert excerpt_of(b"\xff\x00 not json")[1] == "base64"

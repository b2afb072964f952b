"""Admission answers submitted jobs; the queue orders, queues and cancels pending ones."""

from __future__ import annotations

import pytest
from fixtures.checks import check_invariants

from gpuloom.decide.admission import decide_admission, rejection_reason
from gpuloom.decide.queueing import decide_queue
from gpuloom.decide.turns import ROUND
from gpuloom.events import (
    AccountCreated,
    AccountUsersSet,
    JobAdmitted,
    JobCancelled,
    JobQueued,
    JobRejected,
    JobSpec,
)
from gpuloom.queueing.order import queue_key, queue_order
from gpuloom.state import JobState, apply
from gpuloom.state.retention import final_phase
from gpuloom.testing.builders import T0, LogBuilder, make_job_spec


def cluster() -> LogBuilder:
    """n1: 4 x A100-80GB, n2: 2 x H100-80GB (lost, it may come back)."""
    log = LogBuilder()
    log.register("n1", 4, "A100-80GB")
    log.register("n2", 2, "H100-80GB")
    log.lose("n2")
    return log


REASONS = [
    (
        "a model nobody has is rejected naming the models there are",
        make_job_spec(1, gpu_model=["B200"]),
        "no node has GPU model B200 (models in the cluster: A100-80GB, H100-80GB)",
    ),
    (
        "more GPUs than the largest node is rejected",
        make_job_spec(5),
        "job needs 5 GPUs but the largest node has 4",
    ),
    (
        "more GPUs of a model than any node has of it is rejected",
        make_job_spec(3, gpu_model=["H100-80GB"]),
        "job needs 3 H100-80GB GPUs but the largest node has 2",
    ),
    (
        "more GPUs of either allowed model than any node has is rejected",
        make_job_spec(5, gpu_model=["A100-80GB", "B200"]),
        "job needs 5 A100-80GB or B200 GPUs but the largest node has 4",
    ),
    ("a job that fills the largest node is admitted", make_job_spec(4), None),
    (
        "a job that fits a lost node is admitted: lost nodes may come back",
        make_job_spec(2, gpu_model=["H100-80GB"]),
        None,
    ),
    ("a job without GPUs is admitted", make_job_spec(0), None),
]


@pytest.mark.parametrize(
    ("spec", "reason"),
    [(spec, reason) for _, spec, reason in REASONS],
    ids=[sentence for sentence, _, _ in REASONS],
)
def test_rejection_reason(spec: JobSpec, reason: str | None) -> None:
    assert rejection_reason(cluster().state(), spec) == reason


def test_every_job_is_rejected_when_no_node_is_registered() -> None:
    log = LogBuilder()
    log.submit("j1", gpus=0)
    [decision] = decide_admission(log.state())
    assert decision.event == JobRejected(job_id="j1", reason="no node is registered")


def test_a_job_without_gpus_is_admitted_on_a_cluster_without_gpus() -> None:
    log = LogBuilder()
    log.register("cpu-only", 0)
    log.submit("j1", gpus=0)
    [decision] = decide_admission(log.state())
    assert decision.event == JobAdmitted(job_id="j1")


def test_admission_answers_submitted_jobs_in_submission_order_once() -> None:
    log = cluster()
    log.submit("zz", gpus=1)
    log.submit("aa", gpus=9)
    log.submit("mm", gpus=1)
    log.admit("mm")
    log.submit("cc", gpus=1)
    log.request_cancel("cc")
    state = log.state()
    decisions = decide_admission(state)
    assert [type(d.event) for d in decisions] == [JobAdmitted, JobRejected]
    assert [d.event.aggregate_id() for d in decisions] == ["zz", "aa"]
    assert [d.msg_id for d in decisions] == ["zz:admission", "aa:admission"]
    assert [d.causation_id for d in decisions] == [
        state.jobs["zz"].last_event_id,
        state.jobs["aa"].last_event_id,
    ]
    log.record_decisions(decisions)
    state = log.state()
    assert state.voided == 0
    assert decide_admission(state) == [], "a job with a cancel request is left to the queue"


# --- queue ----------------------------------------------------------------------------


def job(job_id: str, priority: int, submit_seq: int) -> JobState:
    return JobState(
        job_id=job_id,
        spec=make_job_spec(priority=priority),
        phase="queued",
        submitted_at=T0,
        submit_seq=submit_seq,
        priority=priority,
    )


def test_queue_key_is_priority_desc_then_submission_then_id() -> None:
    jobs = [job("b", 0, 5), job("a", 0, 5), job("late", 0, 9), job("high", 10, 99)]
    ordered = sorted(jobs, key=lambda j: queue_key(j, False))
    assert [j.job_id for j in ordered] == ["high", "a", "b", "late"]


def test_under_fair_queuing_a_later_users_job_passes_anothers_backlog() -> None:
    """Start-time fair queuing: mallory's 100 tasks take tags 1..100 as they are
    queued; alice's job, queued after 10 of them were placed, takes the clock's next
    tag (11) and goes right behind the task tagged 11, not behind all 100. Among
    one user's jobs, and without a backlog, it is submission order still."""
    log = cluster()
    for index in range(100):
        log.run_to_queue(f"m{index:03}", priority=0, user="mallory")
    state = log.state()
    assert [state.jobs[f"m{i:03}"].queue_tag for i in (0, 1, 99)] == [1, 2, 100]
    state.fair_clock = 10  # as if m000..m009 were placed
    log.run_to_queue("alice-1", priority=0, user="alice")
    log.run_to_queue("alice-2", priority=0, user="alice")
    for recorded in log.records[-6:]:
        apply(state, recorded)
    assert state.jobs["alice-1"].queue_tag == 11 and state.jobs["alice-2"].queue_tag == 12

    def ordered(fair: bool) -> list[str]:
        queued = (state.jobs[j] for j in state.queued)
        return [j.job_id for j in sorted(queued, key=lambda j: queue_key(j, fair))]

    fair = ordered(True)
    assert fair.index("alice-1") == fair.index("m010") + 1
    assert fair.index("alice-2") == fair.index("m011") + 1
    assert ordered(False)[-2:] == ["alice-1", "alice-2"]


def test_queue_order_uses_the_queued_priority_and_skips_cancel_requests() -> None:
    log = cluster()
    log.run_to_queue("first", priority=0)
    log.run_to_queue("next", priority=0)
    log.submit("boosted", priority=0)
    log.admit("boosted")
    log.queue("boosted", priority=50)
    log.run_to_queue("low", priority=-5)
    log.run_to_queue("second", priority=0)
    log.run_to_queue("doomed", priority=100)
    log.request_cancel("doomed")
    state = log.state()
    order = [j.job_id for j in queue_order(state)]
    assert order == ["boosted", "first", "next", "second", "low"]


def test_decide_queue_queues_admitted_jobs_with_their_spec_priority() -> None:
    log = cluster()
    log.submit("b", priority=7)
    log.admit("b")
    log.submit("a", priority=-1)
    log.admit("a")
    log.submit("waiting")
    state = log.state()
    decisions = decide_queue(state)
    assert [d.event for d in decisions] == [
        JobQueued(job_id="b", priority=7),
        JobQueued(job_id="a", priority=-1),
    ]
    assert [d.msg_id for d in decisions] == ["b:queued", "a:queued"]
    assert decisions[0].causation_id == state.jobs["b"].last_event_id


def test_decide_queue_cancels_pending_jobs_with_a_cancel_request() -> None:
    log = cluster()
    for job_id, steps in [("s", 0), ("a", 1), ("q", 2), ("placed", 3), ("kept", 2)]:
        log.submit(job_id)
        if steps >= 1:
            log.admit(job_id)
        if steps >= 2:
            log.queue(job_id)
        if steps >= 3:
            log.place(job_id, "n1", [0])
    for job_id in ("s", "a", "q", "placed"):
        log.request_cancel(job_id)
    state = log.state()
    decisions = decide_queue(state)
    assert [d.event for d in decisions] == [
        JobCancelled(job_id="s"),
        JobCancelled(job_id="a"),
        JobCancelled(job_id="q"),
    ], "an admitted job with a cancel request is cancelled, not queued; a placed one is left"
    assert [d.msg_id for d in decisions] == ["s:cancelled", "a:cancelled", "q:cancelled"]
    log.record_decisions(decisions)
    state = log.state()
    assert state.voided == 0
    assert {final_phase(state, j) for j in ("s", "a", "q")} == {"cancelled"}
    assert decide_queue(state) == []
    check_invariants(state, len(log))


def test_an_account_with_members_admits_only_them() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.append(AccountCreated(account="team"))
    log.append(AccountUsersSet(account="team", users=["alice"]))
    log.submit("ok", gpus=1, user="alice", account="team")
    log.submit("outsider", gpus=1, user="bob", account="team")
    log.submit("elsewhere", gpus=1, user="bob", account="research")  # no list: anyone
    answers = {d.event.job_id: d.event for d in decide_admission(log.state())}
    assert isinstance(answers["ok"], JobAdmitted)
    assert isinstance(answers["elsewhere"], JobAdmitted)
    rejected = answers["outsider"]
    assert isinstance(rejected, JobRejected)
    assert rejected.reason == "user bob may not submit under account team"
    log.append(AccountUsersSet(account="ghost", users=[]))
    assert log.state().voided == 1, "no such account"


def test_a_round_answers_at_most_a_rounds_worth_and_users_take_turns() -> None:
    """mallory's 600 tasks wait before alice's one job: the first round of admission
    answers 500 (`turns.ROUND`), alice's second; the next round the rest of mallory's.
    The queue does the same with what admission let in."""
    log = cluster()
    for index in range(600):
        log.submit(f"m{index:03}", user="mallory")
    log.submit("alice-1", user="alice")
    first = decide_admission(log.state())
    assert len(first) == ROUND
    assert [d.event.job_id for d in first[:3]] == ["m000", "alice-1", "m001"]
    for decision in first:
        log.append(decision.event)
    second = decide_admission(log.state())
    assert [d.event.job_id for d in second] == [f"m{i:03}" for i in range(499, 600)]
    queued = decide_queue(log.state())
    assert len(queued) == ROUND and queued[1].event.job_id == "alice-1"

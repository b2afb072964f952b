"""The fold over hand-written logs: what each valid event does to the state."""

from __future__ import annotations

from datetime import timedelta

from fixtures.checks import apply_expecting_void, check_invariants

from gpuloom.state import ClusterState, Run, apply
from gpuloom.testing.builders import T0, LogBuilder, make_gpus, make_node


def held(state: ClusterState, node: str) -> dict[int, str | None]:
    return {i: gpu.job_id for i, gpu in sorted(state.nodes[node].gpus.items())}


def phase(state: ClusterState, job_id: str) -> str:
    return state.jobs[job_id].phase


def test_a_job_lives_from_submission_to_charge() -> None:
    log = LogBuilder()
    state = ClusterState()
    apply(state, log.register("n1", gpus=4))
    assert state.nodes["n1"].phase == "ready"
    assert state.nodes["n1"].free_gpu_indexes() == [0, 1, 2, 3]

    assert apply(state, log.submit("j1", gpus=2, idempotency_key="k1")).applied
    submitted = state.jobs["j1"]
    assert submitted.phase == "submitted" and state.submitted == {"j1"}
    assert submitted.submitted_at == log.now and submitted.submit_seq == 2
    assert state.idempotency_keys == {"k1": "j1"}

    apply(state, log.admit("j1"))
    assert phase(state, "j1") == "admitted" and state.admitted == {"j1"}
    assert state.submitted == set()

    apply(state, log.queue("j1", priority=3))
    assert phase(state, "j1") == "queued" and state.queued == {"j1"}
    assert state.jobs["j1"].priority == 3

    apply(state, log.place("j1", "n1", [1, 2]))
    job = state.jobs["j1"]
    assert (job.phase, job.attempt, job.node, job.gpu_indexes) == ("placed", 1, "n1", (1, 2))
    assert job.gpu_uuids == ("GPU-n1-1", "GPU-n1-2")
    assert held(state, "n1") == {0: None, 1: "j1", 2: "j1", 3: None}
    assert state.on_node == {"n1": {"j1"}} and state.queued == set()

    started = log.start("j1", "n1")
    apply(state, started)
    assert job.phase == "running" and job.started_at == started.envelope.at
    assert job.runs == [
        Run(
            attempt=1,
            node="n1",
            gpus=2,
            started_at=started.envelope.at,
            gpu_milli=2000,
            milli_by_model={"A100-80GB": 2000},
        )
    ]

    finished = log.finish("j1", "n1", after=3600)
    apply(state, finished)
    assert (job.phase, job.exit_code, job.finished_at) == ("succeeded", 0, finished.envelope.at)
    assert job.runs[0].ended_at == started.envelope.at + timedelta(hours=1)
    assert held(state, "n1") == {0: None, 1: None, 2: None, 3: None}
    assert state.on_node == {"n1": set()}
    assert state.uncharged == {"j1"}

    apply(state, log.charge("j1", gpus=2, seconds=3600))
    assert job.charged_attempts == [1] and state.uncharged == set()
    assert state.usage_by_account == {"research": 7_200_000}
    assert state.usage_by_user == {"alice": 7_200_000}
    assert job.last_event_id == log[-1].envelope.id and job.last_seq == log.seq
    assert (state.seq, state.applied, state.voided) == (len(log), len(log), 0)
    check_invariants(state, len(log))


def test_a_rejected_job_is_final_with_its_reason() -> None:
    log = LogBuilder()
    log.submit("j1", gpus=64)
    rejected = log.reject("j1", "job needs 64 GPUs but the largest node has 4")
    assert log.state().tombstones["j1"].phase == "rejected"  # nothing else refers to it
    job = log.state(keep_history=True).jobs["j1"]
    assert job.phase == "rejected" and job.is_final
    assert job.reason == "job needs 64 GPUs but the largest node has 4"
    assert job.finished_at == rejected.envelope.at


def test_a_failed_run_keeps_exit_code_and_is_charged_by_account_and_user() -> None:
    log = LogBuilder()
    log.register("n1")
    log.run_to_queue("j1", gpus=1, user="bob", account="vision")
    log.place("j1", "n1", [0])
    log.start("j1", "n1")
    log.finish("j1", "n1", "failed", exit_code=137, after=10)
    log.charge("j1", user="bob", account="vision", seconds=10)
    assert "j1" in log.state(upto=len(log) - 1).jobs, "kept until it is charged"
    assert "j1" in log.state().tombstones
    state = log.state(keep_history=True)
    assert (state.jobs["j1"].phase, state.jobs["j1"].exit_code) == ("failed", 137)
    assert state.usage_by_account == {"vision": 10_000}
    assert state.usage_by_user == {"bob": 10_000}


def test_a_job_finished_while_placed_frees_its_gpus_without_a_run() -> None:
    log = LogBuilder()
    log.register("n1")
    log.run_to_queue("j1", gpus=2)
    log.place("j1", "n1", [0, 1])
    log.request_cancel("j1")
    log.finish("j1", "n1", "cancelled", exit_code=None)
    state = log.state(keep_history=True)
    assert state.jobs["j1"].phase == "cancelled"
    assert state.jobs["j1"].runs == []
    assert state.nodes["n1"].free_gpu_indexes() == [0, 1, 2, 3]
    assert state.uncharged == set()


# --- cancelling -----------------------------------------------------------------------


def test_a_cancel_request_on_a_queued_job_waits_for_the_queue() -> None:
    log = LogBuilder()
    log.run_to_queue("j1")
    log.request_cancel("j1")
    state = log.state(keep_history=True)
    assert state.jobs["j1"].cancel_requested
    assert state.cancel_pending == {"j1"}
    apply(state, log.cancel("j1"), keep_history=True)
    assert state.jobs["j1"].phase == "cancelled"
    assert state.jobs["j1"].reason == "cancelled by user"
    assert state.cancel_pending == set() and state.queued == set()


def test_a_cancel_request_on_a_running_job_is_left_to_the_agent() -> None:
    log = LogBuilder()
    log.register("n1")
    log.run_to_queue("j1")
    log.place("j1", "n1", [0])
    log.start("j1", "n1")
    log.request_cancel("j1")
    state = log.state()
    assert state.jobs["j1"].cancel_requested and state.jobs["j1"].phase == "running"
    assert state.cancel_pending == set()


def test_job_cancelled_frees_the_gpus_of_a_placed_job() -> None:
    log = LogBuilder()
    log.register("n1")
    log.run_to_queue("j1", gpus=3)
    log.place("j1", "n1", [0, 1, 2])
    cancelled = log.cancel("j1")
    state = log.state(keep_history=True)
    assert state.jobs["j1"].phase == "cancelled"
    assert state.jobs["j1"].finished_at == cancelled.envelope.at
    assert state.nodes["n1"].free_gpu_indexes() == [0, 1, 2, 3]
    assert state.on_node == {"n1": set()}
    check_invariants(state, len(log), keep_history=True)


def test_job_cancelled_is_voided_for_a_running_job() -> None:
    log = LogBuilder()
    log.register("n1")
    log.run_to_queue("j1")
    log.place("j1", "n1", [0])
    log.start("j1", "n1")
    state = log.state()
    apply_expecting_void(state, log.cancel("j1"), "job j1 is running")
    assert held(state, "n1")[0] == "j1"


# --- nodes ----------------------------------------------------------------------------


def lost_node_log() -> LogBuilder:
    """`run` runs on n1 GPUs 0-1, `wait` is placed on n1 GPU 2, `far` runs on n2."""
    log = LogBuilder()
    log.register("n1", 4)
    log.register("n2", 2)
    log.run_to_queue("run", gpus=2)
    log.place("run", "n1", [0, 1])
    log.start("run", "n1")
    log.run_to_queue("wait", gpus=1)
    log.place("wait", "n1", [2])
    log.run_to_queue("far", gpus=1)
    log.place("far", "n2", [0])
    log.start("far", "n2")
    log.run_to_queue("pending", gpus=1)
    return log


def test_node_lost_requeues_its_running_and_placed_jobs() -> None:
    log = lost_node_log()
    lost = log.lose("n1", "no heartbeat for 12.0s", after=600)
    state = log.state()
    node = state.nodes["n1"]
    assert (node.phase, node.lost_at) == ("lost", lost.envelope.at)
    assert node.free_gpu_indexes() == [0, 1, 2, 3]
    for job_id in ("run", "wait"):
        job = state.jobs[job_id]
        assert job.phase == "queued"
        assert (job.node, job.gpu_indexes, job.gpu_uuids) == (None, (), ())
        assert job.attempt == 1, "the attempt is kept: the next placement is attempt 2"
        assert job.reason == "requeued: node n1 lost (no heartbeat for 12.0s)"
    assert state.jobs["run"].runs[0].ended_at == lost.envelope.at
    assert state.jobs["wait"].runs == []
    assert state.queued == {"run", "wait", "pending"}
    assert state.uncharged == {"run"}
    assert state.on_node == {"n1": set(), "n2": {"far"}}
    assert state.jobs["far"].phase == "running" and held(state, "n2")[0] == "far"
    check_invariants(state, len(log))


def test_a_requeued_job_is_placed_again_with_the_next_attempt() -> None:
    log = lost_node_log()
    log.lose("n1")
    state = log.state()
    apply_expecting_void(state, log.place("run", "n2", [1], attempt=1), "attempt 1 but")
    apply(state, log.recover("n1"))
    # `run` asked for 2 GPUs: place it again on n1.
    apply(state, log.place("run", "n1", [2, 3], attempt=2))
    apply(state, log.start("run", "n1", attempt=2))
    apply_expecting_void(state, log.finish("run", "n1", attempt=1), "not job run's current")
    apply(state, log.finish("run", "n1", attempt=2, after=5))
    job = state.jobs["run"]
    assert job.phase == "succeeded"
    assert [(r.attempt, r.ended_at is not None) for r in job.runs] == [(1, True), (2, True)]
    check_invariants(state, len(log))


def test_node_lost_cancels_its_jobs_that_have_a_cancel_request() -> None:
    log = lost_node_log()
    log.request_cancel("run")
    log.request_cancel("wait")
    lost = log.lose("n1")
    assert "wait" in log.state().tombstones, "placed, never ran: nothing left to charge"
    state = log.state(keep_history=True)
    for job_id in ("run", "wait"):
        job = state.jobs[job_id]
        assert job.phase == "cancelled"
        assert job.finished_at == lost.envelope.at
        assert job.reason == "node n1 lost while cancelling"
    assert state.jobs["run"].runs[0].ended_at == lost.envelope.at
    assert state.queued == {"pending"}
    check_invariants(state, len(log), keep_history=True)


def test_node_recovered_makes_a_lost_node_ready_again() -> None:
    log = lost_node_log()
    log.lose("n1")
    log.recover("n1")
    node = log.state().nodes["n1"]
    assert (node.phase, node.lost_at) == ("ready", None)


def test_re_registration_with_the_same_gpus_keeps_allocations() -> None:
    log = lost_node_log()
    again = log.append(make_node("n1", 4, labels={"zone": "b"}))
    state = log.state()
    assert state.voided == 0
    assert state.nodes["n1"].spec.labels == {"zone": "b"}
    assert state.nodes["n1"].registered_at == again.envelope.at
    assert held(state, "n1") == {0: "run", 1: "run", 2: "wait", 3: None}
    check_invariants(state, len(log))


def test_re_registration_may_add_gpus_and_drop_free_ones() -> None:
    log = lost_node_log()
    log.register("n1", gpu_list=make_gpus("n1", 3) + make_gpus("n1", 2, first_index=5))
    state = log.state()
    assert state.voided == 0
    assert held(state, "n1") == {0: "run", 1: "run", 2: "wait", 5: None, 6: None}
    check_invariants(state, len(log))


def test_re_registering_a_lost_node_makes_it_ready() -> None:
    log = lost_node_log()
    log.lose("n1")
    log.register("n1", 8)
    node = log.state().nodes["n1"]
    assert (node.phase, node.lost_at, len(node.gpus)) == ("ready", None, 8)


def test_times_come_from_envelopes_not_from_a_clock() -> None:
    log = LogBuilder(start=T0 - timedelta(days=365))
    log.register("n1")
    log.run_to_queue("j1")
    log.place("j1", "n1", [0])
    started = log.start("j1", "n1")
    assert log.state().jobs["j1"].started_at == T0 - timedelta(days=365) + timedelta(seconds=5)
    assert started.envelope.at == log.now

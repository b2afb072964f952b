"""The pure reconcile step: which processes to start, stop, drop, and what to report."""

from __future__ import annotations

from agent_events import cancel, lose, place, recover, register, run_job, start

from gpuloom.events import JobFinished, JobStarted
from gpuloom.testing.memlog import MemoryLog
from services.agent.reconcile import (
    Drop,
    Ensure,
    Forget,
    Local,
    Report,
    Status,
    Stop,
    reconcile,
)

SLEEP = ["sleep", "60"]


def local(status: Status = Status.RUNNING, pid: int = 4242, node: str = "node-a") -> Local:
    return Local(node=node, pid=pid, status=status)


def test_a_placed_job_without_a_process_is_ensured(log: MemoryLog) -> None:
    run_job(log, "j1", SLEEP, gpus=1, gpu_indexes=[1], time_limit_s=30)

    [action] = reconcile(log.state, ["node-a"], {})

    assert isinstance(action, Ensure)
    assert (action.key, action.node, action.phase) == (("j1", 1, 0), "node-a", "placed")
    assert action.gpu_indexes == (1,) and action.gpu_uuids == ("GPU-node-a-1",)
    assert action.spec.time_limit_s == 30 and action.started_at is None


def test_a_placed_job_with_a_process_is_reported_started_until_the_log_says_so(
    log: MemoryLog,
) -> None:
    run_job(log, "j1", SLEEP)

    [action] = reconcile(log.state, ["node-a"], {("j1", 1, 0): local(pid=77)})

    assert isinstance(action, Report)
    assert action.decision.msg_id == "j1:started:1"
    assert action.decision.event == JobStarted(job_id="j1", attempt=1, node="node-a", pid=77)
    assert action.decision.causation_id == log.state.jobs["j1"].last_event_id
    start(log, "j1")
    assert reconcile(log.state, ["node-a"], {("j1", 1, 0): local(pid=77)}) == []


def test_a_running_job_without_a_process_is_ensured_with_its_start_time(log: MemoryLog) -> None:
    run_job(log, "j1", SLEEP)
    start(log, "j1")

    [action] = reconcile(log.state, ["node-a"], {})

    assert isinstance(action, Ensure)
    assert action.phase == "running"
    assert action.started_at == log.state.jobs["j1"].runs[-1].started_at


def test_a_job_cancelled_while_placed_is_reported_cancelled_without_starting(
    log: MemoryLog,
) -> None:
    run_job(log, "j1", SLEEP)
    cancel(log, "j1")

    [action] = reconcile(log.state, ["node-a"], {})

    assert isinstance(action, Report)
    assert action.decision.msg_id == "j1:finished:1"
    assert action.decision.event == JobFinished(
        job_id="j1",
        attempt=1,
        node="node-a",
        outcome="cancelled",
        exit_code=None,
        reason="cancelled before start",
    )


def test_a_cancelled_job_with_a_process_is_stopped_once(log: MemoryLog) -> None:
    run_job(log, "j1", SLEEP)
    start(log, "j1")
    cancel(log, "j1")

    assert reconcile(log.state, ["node-a"], {("j1", 1, 0): local()}) == [Stop(("j1", 1, 0))]
    assert reconcile(log.state, ["node-a"], {("j1", 1, 0): local(Status.STOPPING)}) == []


def test_processes_of_jobs_requeued_after_node_loss_are_dropped(log: MemoryLog) -> None:
    run_job(log, "j1", SLEEP)
    run_job(log, "j2", SLEEP)
    run_job(log, "j3", SLEEP)
    run_job(log, "j4", SLEEP)
    lose(log, "node-a")
    procs = {
        ("j1", 1, 0): local(Status.RUNNING),
        ("j2", 1, 0): local(Status.EXITED),
        ("j3", 1, 0): local(Status.DROPPING),
        ("j4", 1, 0): local(Status.ORPHAN),
    }

    actions = reconcile(log.state, ["node-a"], procs)

    assert actions == [Drop(("j1", 1, 0)), Forget(("j2", 1, 0)), Drop(("j4", 1, 0))]


def test_a_superseded_attempt_is_dropped_and_the_current_one_ensured(log: MemoryLog) -> None:
    run_job(log, "j1", SLEEP)
    lose(log, "node-a")
    recover(log, "node-a")
    place(log, "j1", "node-a")

    actions = reconcile(log.state, ["node-a"], {("j1", 1, 0): local()})

    ensure, drop = actions
    assert isinstance(ensure, Ensure) and ensure.key == ("j1", 2, 0)
    assert drop == Drop(("j1", 1, 0))


def test_jobs_of_other_nodes_are_not_ours(log: MemoryLog) -> None:
    register(log, "node-b")
    run_job(log, "j1", SLEEP, node="node-b")

    assert reconcile(log.state, ["node-a"], {}) == []
    stray = {("j1", 1, 0): local(node="node-a")}
    assert reconcile(log.state, ["node-a"], stray) == [Drop(("j1", 1, 0))]


def test_an_orphan_found_at_start_up_is_ensured_again(log: MemoryLog) -> None:
    run_job(log, "j1", SLEEP)
    start(log, "j1")

    [action] = reconcile(log.state, ["node-a"], {("j1", 1, 0): local(Status.ORPHAN)})

    assert isinstance(action, Ensure) and action.key == ("j1", 1, 0)


def test_finished_jobs_and_exited_processes_need_nothing_more(log: MemoryLog) -> None:
    run_job(log, "j1", SLEEP)
    start(log, "j1")

    assert reconcile(log.state, ["node-a"], {("j1", 1, 0): local(Status.EXITED)}) == []


def test_actions_come_in_node_then_job_order(log: MemoryLog) -> None:
    register(log, "node-b")
    for job_id, node in [("j3", "node-b"), ("j2", "node-a"), ("j1", "node-b"), ("j0", "node-a")]:
        run_job(log, job_id, SLEEP, node=node)

    actions = reconcile(log.state, ["node-b", "node-a"], {})

    assert [(a.node, a.job_id) for a in actions if isinstance(a, Ensure)] == [
        ("node-a", "j0"),
        ("node-a", "j2"),
        ("node-b", "j1"),
        ("node-b", "j3"),
    ]

"""The agent against the log kept in memory: decide, run, report; and surviving its own
death."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from agent_events import (
    AgentReactor,
    cancel,
    lose,
    msg_ids,
    of_type,
    publish,
    recorded,
    run_job,
    start,
    types_of,
)

from gpuloom.events import JobFinished, JobStarted
from gpuloom.state import FINAL_PHASES, ClusterState
from gpuloom.state.retention import final_phase
from gpuloom.testing.memlog import MemoryLog
from services.agent.agent import Agent
from services.agent.outcomes import Exited
from services.agent.shim import Ended, RunDir

ENVIRON = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


@asynccontextmanager
async def agent_running(log: MemoryLog, root: Path, *, watch: bool = True) -> AsyncIterator[Agent]:
    """An agent whose watcher and outbox run; leaving the block is a `kill -9`:
    the agent's tasks stop, its jobs' processes do not."""
    agent = Agent(["node-a"], root, grace_s=1.0, poll_s=0.02, environ=ENVIRON)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(agent.run_outbox(AgentReactor(log), stop, retry_s=0.05))]
    if watch:
        tasks.append(asyncio.create_task(agent.runner.run(stop)))
    try:
        yield agent
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def drive(
    agent: Agent, log: MemoryLog, until: Callable[[], bool], timeout: float = 8.0
) -> None:
    """What the Reactor does: decide on the folded state and publish, until `until()`."""
    deadline = time.monotonic() + timeout
    reactor = AgentReactor(log)
    while not until():
        assert time.monotonic() < deadline, f"timed out; log: {recorded(log)[-3:]}"
        decisions = await agent.decide(log.state)
        with contextlib.suppress(ConnectionError):  # the Reactor decides again later
            await reactor.publish(decisions)
        await asyncio.sleep(0.02)


def phase(log: MemoryLog, job_id: str) -> Callable[[], bool]:
    def check() -> bool:
        return final_phase(log.state, job_id) in FINAL_PHASES  # live, or a tombstone

    return check


def finishes(log: MemoryLog, job_id: str) -> list[JobFinished]:
    return [
        e for e in of_type(log, "JobFinished") if isinstance(e, JobFinished) and e.job_id == job_id
    ]


async def test_a_placed_job_runs_and_succeeds(log: MemoryLog, run_root: Path) -> None:
    run_job(log, "j1", ["sh", "-c", "echo hello"], gpus=1, gpu_indexes=[0])

    async with agent_running(log, run_root) as agent:
        await drive(agent, log, phase(log, "j1"))

    job = log.state.jobs["j1"]
    assert (job.phase, job.exit_code, len(job.runs)) == ("succeeded", 0, 1)
    assert [r.envelope.type for r in recorded(log)[-2:]] == ["JobStarted", "JobFinished"]
    assert {"j1:started:1", "j1:finished:1"} <= msg_ids(log)
    assert log.state.voided == 0
    assert RunDir(agent.runner.root, "node-a", "j1", 1).file("stdout").read_text() == "hello\n"


async def test_a_job_that_ends_before_its_start_is_published_is_still_started_first(
    log: MemoryLog, run_root: Path
) -> None:
    run_job(log, "quick", ["true"])

    async with agent_running(log, run_root) as agent:
        [started] = await agent.decide(log.state)  # the publish is slow...
        await drive(agent, log, phase(log, "quick"), timeout=5)  # ...the end is not
        await publish(log, [started])  # de-duplicated

    assert types_of(log, "quick")[-2:] == ["JobStarted", "JobFinished"]
    assert log.state.jobs["quick"].phase == "succeeded"
    assert len(log.state.jobs["quick"].runs) == 1


async def test_a_running_job_is_cancelled(log: MemoryLog, run_root: Path) -> None:
    run_job(log, "j1", ["sleep", "30"])

    async with agent_running(log, run_root) as agent:
        await drive(agent, log, lambda: log.state.jobs["j1"].phase == "running")
        cancel(log, "j1")
        await drive(agent, log, phase(log, "j1"))

    [finished] = finishes(log, "j1")
    assert (finished.outcome, finished.exit_code, finished.reason) == (
        "cancelled",
        143,
        "cancelled by user",
    )


async def test_a_job_cancelled_before_start_never_runs(log: MemoryLog, run_root: Path) -> None:
    run_job(log, "j1", ["sleep", "30"])
    cancel(log, "j1")

    async with agent_running(log, run_root) as agent:
        await drive(agent, log, phase(log, "j1"))

    assert final_phase(log.state, "j1") == "cancelled"
    assert of_type(log, "JobStarted") == []
    assert not RunDir(agent.runner.root, "node-a", "j1", 1).exists()


async def test_a_command_that_cannot_run_fails_without_starting(
    log: MemoryLog, run_root: Path
) -> None:
    run_job(log, "j1", ["no-such-program"])

    async with agent_running(log, run_root) as agent:
        await drive(agent, log, phase(log, "j1"))

    [finished] = finishes(log, "j1")
    assert (finished.outcome, finished.exit_code) == ("failed", 127)
    assert finished.reason == "cannot run command: no-such-program: command not found"
    assert of_type(log, "JobStarted") == []


async def test_a_job_over_its_time_limit_times_out(log: MemoryLog, run_root: Path) -> None:
    run_job(log, "j1", ["sleep", "30"], time_limit_s=1)

    async with agent_running(log, run_root) as agent:
        await drive(agent, log, phase(log, "j1"))

    job = log.state.jobs["j1"]
    assert (job.phase, job.reason) == ("timed_out", "time limit of 1 s exceeded")


async def test_the_job_of_a_lost_node_is_killed_silently(log: MemoryLog, run_root: Path) -> None:
    run_job(log, "j1", ["sleep", "30"])

    async with agent_running(log, run_root) as agent:
        await drive(agent, log, lambda: log.state.jobs["j1"].phase == "running")
        lose(log, "node-a")  # the job is requeued
        await drive(agent, log, lambda: agent.runner.views() == {})

    assert finishes(log, "j1") == []
    assert log.state.jobs["j1"].phase == "queued"
    pid = RunDir(agent.runner.root, "node-a", "j1", 1).read_pid()
    assert pid is not None and not RunDir(agent.runner.root, "node-a", "j1", 1).shim_alive(pid)


async def test_an_end_is_published_once_nats_is_back(log: MemoryLog, run_root: Path) -> None:
    run_job(log, "j1", ["sh", "-c", "sleep 0.3; exit 2"])

    async with agent_running(log, run_root) as agent:
        await drive(agent, log, lambda: log.state.jobs["j1"].phase == "running")
        log.fail_publishes = 3  # NATS goes away while the job ends
        await drive(agent, log, phase(log, "j1"))

    assert log.fail_publishes == 0
    [finished] = finishes(log, "j1")
    assert (finished.outcome, finished.reason) == ("failed", "exit code 2")


async def test_jobs_survive_a_kill_9_of_the_agent(log: MemoryLog, run_root: Path) -> None:
    run_job(log, "long", ["sh", "-c", "sleep 0.8; echo done"])
    run_job(log, "short", ["true"])
    run_job(log, "limited", ["sleep", "30"], time_limit_s=1)
    on_node = ("long", "short", "limited")

    async with agent_running(log, run_root, watch=False) as first:
        await drive(first, log, lambda: all(log.state.jobs[j].phase == "running" for j in on_node))
    # The first agent is gone; "short" ends unwatched, "long" and "limited" keep running.
    while RunDir(first.runner.root, "node-a", "short", 1).read_exit() is None:
        await asyncio.sleep(0.02)

    async with agent_running(log, run_root) as second:
        assert second.runner.scan(["node-a"]) == 2
        await drive(second, log, lambda: all(phase(log, j)() for j in on_node))

    outcomes = {j: [(f.outcome, f.reason) for f in finishes(log, j)] for j in on_node}
    assert outcomes == {
        "long": [("succeeded", None)],
        "short": [("succeeded", None)],
        "limited": [("timed_out", "time limit of 1 s exceeded")],
    }
    assert len(of_type(log, "JobStarted")) == 3
    assert log.state.voided == 0


async def test_a_job_whose_process_vanished_with_the_agent_is_failed(
    log: MemoryLog, run_root: Path
) -> None:
    run_job(log, "j1", ["sleep", "30"])
    start(log, "j1")
    run = RunDir(run_root.resolve(), "node-a", "j1", 1)
    run.create()
    run.file("stdout").write_text("")
    run.file("pid").write_text("999999999\n")  # no such process, no exit file

    async with agent_running(log, run_root) as agent:
        await drive(agent, log, phase(log, "j1"))

    [finished] = finishes(log, "j1")
    assert (finished.outcome, finished.reason) == ("failed", "agent lost the process")


async def test_started_events_carry_the_shim_pid(log: MemoryLog, run_root: Path) -> None:
    run_job(log, "j1", ["sleep", "30"])

    async with agent_running(log, run_root) as agent:
        await drive(agent, log, lambda: log.state.jobs["j1"].phase == "running")
        [started] = of_type(log, "JobStarted")
        assert isinstance(started, JobStarted)
        assert started.pid == RunDir(agent.runner.root, "node-a", "j1", 1).read_pid()
        cancel(log, "j1")
        await drive(agent, log, phase(log, "j1"))


async def test_a_job_requeued_while_the_agent_was_dead_is_killed_on_restart(
    log: MemoryLog, run_root: Path
) -> None:
    run_job(log, "j1", ["sleep", "30"])
    async with agent_running(log, run_root, watch=False) as first:
        await drive(first, log, lambda: log.state.jobs["j1"].phase == "running")
    lose(log, "node-a")  # the dead agent stopped heartbeating: the job is requeued

    async with agent_running(log, run_root) as second:
        assert second.runner.scan(["node-a"]) == 1
        await drive(second, log, lambda: second.runner.views() == {})

    run = RunDir(second.runner.root, "node-a", "j1", 1)
    pid = run.read_pid()
    assert pid is not None and not run.shim_alive(pid)
    assert finishes(log, "j1") == []
    assert log.state.jobs["j1"].phase == "queued"


def test_the_end_of_a_job_the_state_no_longer_knows_is_dropped(run_root: Path) -> None:
    """Ended, forgotten and its tombstone expired (or restored from a snapshot that never
    held it): nothing can fold its end, so the outbox drops it instead of retrying it
    twice a second for ever."""
    agent = Agent(["node-a"], run_root, environ=ENVIRON)
    end = Ended("failed", 1, "exit code 1")
    agent.on_exit(Exited(("gone", 1, 0), "node-a", 4242, end))
    assert agent.due(ClusterState(seq=10)) == ([], [])
    assert agent.outbox == {}

"""The agent against an in-memory log: decide, run, report; and surviving its own death."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

from agent_fakelog import FakeLog

from gpuloom.events import JobFinished, JobStarted
from gpuloom.state import FINAL_PHASES, ClusterState
from gpuloom.state.retention import final_phase
from services.agent.agent import Agent
from services.agent.outcomes import Exited
from services.agent.shim import Ended, RunDir

ENVIRON = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


@asynccontextmanager
async def agent_running(
    fake_log: FakeLog, root: Path, *, watch: bool = True
) -> AsyncIterator[Agent]:
    """An agent whose watcher and outbox run; leaving the block is a `kill -9`:
    the agent's tasks stop, its jobs' processes do not."""
    agent = Agent(["node-a"], root, grace_s=1.0, poll_s=0.02, environ=ENVIRON)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(agent.run_outbox(fake_log, stop, retry_s=0.05))]
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
    agent: Agent, fake_log: FakeLog, until: Callable[[], bool], timeout: float = 8.0
) -> None:
    """What the Reactor does: decide on the folded state and publish, until `until()`."""
    deadline = time.monotonic() + timeout
    while not until():
        assert time.monotonic() < deadline, f"timed out; log: {fake_log.recorded[-3:]}"
        decisions = await agent.decide(fake_log.state)
        with contextlib.suppress(ConnectionError):  # the Reactor decides again later
            await fake_log.publish(decisions)
        await asyncio.sleep(0.02)


def phase(fake_log: FakeLog, job_id: str) -> Callable[[], bool]:
    def check() -> bool:
        return final_phase(fake_log.state, job_id) in FINAL_PHASES  # live, or a tombstone

    return check


def finishes(fake_log: FakeLog, job_id: str) -> list[JobFinished]:
    return [
        e
        for e in fake_log.of_type("JobFinished")
        if isinstance(e, JobFinished) and e.job_id == job_id
    ]


async def test_a_placed_job_runs_and_succeeds(fake_log: FakeLog, run_root: Path) -> None:
    fake_log.run("j1", ["sh", "-c", "echo hello"], gpus=1, gpu_indexes=[0])

    async with agent_running(fake_log, run_root) as agent:
        await drive(agent, fake_log, phase(fake_log, "j1"))

    job = fake_log.state.jobs["j1"]
    assert (job.phase, job.exit_code, len(job.runs)) == ("succeeded", 0, 1)
    assert [r.envelope.type for r in fake_log.recorded[-2:]] == ["JobStarted", "JobFinished"]
    assert {"j1:started:1", "j1:finished:1"} <= fake_log.msg_ids
    assert fake_log.state.voided == 0
    assert RunDir(agent.runner.root, "node-a", "j1", 1).file("stdout").read_text() == "hello\n"


async def test_a_job_that_ends_before_its_start_is_published_is_still_started_first(
    fake_log: FakeLog, run_root: Path
) -> None:
    fake_log.run("quick", ["true"])

    async with agent_running(fake_log, run_root) as agent:
        [started] = await agent.decide(fake_log.state)  # the publish is slow...
        await drive(agent, fake_log, phase(fake_log, "quick"), timeout=5)  # ...the end is not
        await fake_log.publish([started])  # de-duplicated

    assert fake_log.types_of("quick")[-2:] == ["JobStarted", "JobFinished"]
    assert fake_log.state.jobs["quick"].phase == "succeeded"
    assert len(fake_log.state.jobs["quick"].runs) == 1


async def test_a_running_job_is_cancelled(fake_log: FakeLog, run_root: Path) -> None:
    fake_log.run("j1", ["sleep", "30"])

    async with agent_running(fake_log, run_root) as agent:
        await drive(agent, fake_log, lambda: fake_log.state.jobs["j1"].phase == "running")
        fake_log.cancel("j1")
        await drive(agent, fake_log, phase(fake_log, "j1"))

    [finished] = finishes(fake_log, "j1")
    assert (finished.outcome, finished.exit_code, finished.reason) == (
        "cancelled",
        143,
        "cancelled by user",
    )


async def test_a_job_cancelled_before_start_never_runs(fake_log: FakeLog, run_root: Path) -> None:
    fake_log.run("j1", ["sleep", "30"])
    fake_log.cancel("j1")

    async with agent_running(fake_log, run_root) as agent:
        await drive(agent, fake_log, phase(fake_log, "j1"))

    assert final_phase(fake_log.state, "j1") == "cancelled"
    assert fake_log.of_type("JobStarted") == []
    assert not RunDir(agent.runner.root, "node-a", "j1", 1).exists()


async def test_a_command_that_cannot_run_fails_without_starting(
    fake_log: FakeLog, run_root: Path
) -> None:
    fake_log.run("j1", ["no-such-program"])

    async with agent_running(fake_log, run_root) as agent:
        await drive(agent, fake_log, phase(fake_log, "j1"))

    [finished] = finishes(fake_log, "j1")
    assert (finished.outcome, finished.exit_code) == ("failed", 127)
    assert finished.reason == "cannot run command: no-such-program: command not found"
    assert fake_log.of_type("JobStarted") == []


async def test_a_job_over_its_time_limit_times_out(fake_log: FakeLog, run_root: Path) -> None:
    fake_log.run("j1", ["sleep", "30"], time_limit_s=1)

    async with agent_running(fake_log, run_root) as agent:
        await drive(agent, fake_log, phase(fake_log, "j1"))

    job = fake_log.state.jobs["j1"]
    assert (job.phase, job.reason) == ("timed_out", "time limit of 1 s exceeded")


async def test_the_job_of_a_lost_node_is_killed_silently(fake_log: FakeLog, run_root: Path) -> None:
    fake_log.run("j1", ["sleep", "30"])

    async with agent_running(fake_log, run_root) as agent:
        await drive(agent, fake_log, lambda: fake_log.state.jobs["j1"].phase == "running")
        fake_log.lose("node-a")  # the job is requeued
        await drive(agent, fake_log, lambda: agent.runner.views() == {})

    assert finishes(fake_log, "j1") == []
    assert fake_log.state.jobs["j1"].phase == "queued"
    pid = RunDir(agent.runner.root, "node-a", "j1", 1).read_pid()
    assert pid is not None and not RunDir(agent.runner.root, "node-a", "j1", 1).shim_alive(pid)


async def test_an_end_is_published_once_nats_is_back(fake_log: FakeLog, run_root: Path) -> None:
    fake_log.run("j1", ["sh", "-c", "sleep 0.3; exit 2"])

    async with agent_running(fake_log, run_root) as agent:
        await drive(agent, fake_log, lambda: fake_log.state.jobs["j1"].phase == "running")
        fake_log.fail_publishes = 3  # NATS goes away while the job ends
        await drive(agent, fake_log, phase(fake_log, "j1"))

    assert fake_log.fail_publishes == 0
    [finished] = finishes(fake_log, "j1")
    assert (finished.outcome, finished.reason) == ("failed", "exit code 2")


async def test_jobs_survive_a_kill_9_of_the_agent(fake_log: FakeLog, run_root: Path) -> None:
    fake_log.run("long", ["sh", "-c", "sleep 0.8; echo done"])
    fake_log.run("short", ["true"])
    fake_log.run("limited", ["sleep", "30"], time_limit_s=1)
    on_node = ("long", "short", "limited")

    async with agent_running(fake_log, run_root, watch=False) as first:
        await drive(
            first, fake_log, lambda: all(fake_log.state.jobs[j].phase == "running" for j in on_node)
        )
    # The first agent is gone; "short" ends unwatched, "long" and "limited" keep running.
    while RunDir(first.runner.root, "node-a", "short", 1).read_exit() is None:
        await asyncio.sleep(0.02)

    async with agent_running(fake_log, run_root) as second:
        assert second.runner.scan(["node-a"]) == 2
        await drive(second, fake_log, lambda: all(phase(fake_log, j)() for j in on_node))

    outcomes = {j: [(f.outcome, f.reason) for f in finishes(fake_log, j)] for j in on_node}
    assert outcomes == {
        "long": [("succeeded", None)],
        "short": [("succeeded", None)],
        "limited": [("timed_out", "time limit of 1 s exceeded")],
    }
    assert len(fake_log.of_type("JobStarted")) == 3
    assert fake_log.state.voided == 0


async def test_a_job_whose_process_vanished_with_the_agent_is_failed(
    fake_log: FakeLog, run_root: Path
) -> None:
    fake_log.run("j1", ["sleep", "30"])
    fake_log.started("j1")
    run = RunDir(run_root.resolve(), "node-a", "j1", 1)
    run.create()
    run.file("stdout").write_text("")
    run.file("pid").write_text("999999999\n")  # no such process, no exit file

    async with agent_running(fake_log, run_root) as agent:
        await drive(agent, fake_log, phase(fake_log, "j1"))

    [finished] = finishes(fake_log, "j1")
    assert (finished.outcome, finished.reason) == ("failed", "agent lost the process")


async def test_started_events_carry_the_shim_pid(fake_log: FakeLog, run_root: Path) -> None:
    fake_log.run("j1", ["sleep", "30"])

    async with agent_running(fake_log, run_root) as agent:
        await drive(agent, fake_log, lambda: fake_log.state.jobs["j1"].phase == "running")
        [started] = fake_log.of_type("JobStarted")
        assert isinstance(started, JobStarted)
        assert started.pid == RunDir(agent.runner.root, "node-a", "j1", 1).read_pid()
        fake_log.cancel("j1")
        await drive(agent, fake_log, phase(fake_log, "j1"))


async def test_a_job_requeued_while_the_agent_was_dead_is_killed_on_restart(
    fake_log: FakeLog, run_root: Path
) -> None:
    fake_log.run("j1", ["sleep", "30"])
    async with agent_running(fake_log, run_root, watch=False) as first:
        await drive(first, fake_log, lambda: fake_log.state.jobs["j1"].phase == "running")
    fake_log.lose("node-a")  # the dead agent stopped heartbeating: the job is requeued

    async with agent_running(fake_log, run_root) as second:
        assert second.runner.scan(["node-a"]) == 1
        await drive(second, fake_log, lambda: second.runner.views() == {})

    run = RunDir(second.runner.root, "node-a", "j1", 1)
    pid = run.read_pid()
    assert pid is not None and not run.shim_alive(pid)
    assert finishes(fake_log, "j1") == []
    assert fake_log.state.jobs["j1"].phase == "queued"


def test_the_end_of_a_job_the_state_no_longer_knows_is_dropped(run_root: Path) -> None:
    """Ended, forgotten and its tombstone expired (or restored from a snapshot that never
    held it): nothing can fold its end, so the outbox drops it instead of retrying it
    twice a second for ever."""
    agent = Agent(["node-a"], run_root, environ=ENVIRON)
    end = Ended("failed", 1, "exit code 1")
    agent.on_exit(Exited(("gone", 1, 0), "node-a", 4242, end))
    assert agent.due(ClusterState(seq=10)) == ([], [])
    assert agent.outbox == {}

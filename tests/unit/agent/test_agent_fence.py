"""Self-fencing: an agent cut off from the bus stops its jobs, starts none, and reports
nothing until it has caught up with the log; then ends the log requeued are dropped."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest
from agent_events import lose, run_job
from test_agent_flow import agent_running, drive, finishes, phase

from gpuloom.config import Settings
from gpuloom.testing.memlog import MemoryLog
from services.agent.agent import Agent
from services.agent.fence import Fence, plan, watch
from services.agent.reconcile import Status
from services.agent.shim import RunDir

# --- the bookkeeping --------------------------------------------------------------------


def test_the_fence_goes_up_once_after_the_cut_off_and_lifts_once_caught_up() -> None:
    fence = Fence(after_s=3.0, last_contact=100.0)
    assert not fence.silence(102.9), "not cut off long enough"
    assert fence.silence(103.0)
    assert not fence.silence(104.0), "only once per cut-off"
    assert fence.holds(state_seq=50)

    assert fence.contact(105.0), "back: the fence needs the stream's last seq"
    fence.resumed(60)
    assert not fence.contact(105.5), "it has it"
    assert fence.holds(state_seq=59), "not caught up yet"
    assert not fence.holds(state_seq=60)
    assert not fence.fenced and not fence.holds(state_seq=0)


def test_a_new_cut_off_while_fenced_needs_a_new_resume_seq() -> None:
    fence = Fence(after_s=1.0, last_contact=0.0)
    assert fence.silence(2.0)
    fence.contact(3.0)
    fence.resumed(10)
    assert not fence.silence(3.5), "already fenced"
    assert fence.holds(state_seq=10), "what it caught up to was before this cut-off"
    assert fence.contact(4.0)


async def test_watch_fences_after_failed_probes_and_fetches_the_seq_when_back() -> None:
    fence = Fence(after_s=0.2, last_contact=time.monotonic())
    reachable = True
    fenced_for: list[float] = []
    stop = asyncio.Event()

    async def probe(timeout: float) -> bool:
        return reachable

    async def last_seq() -> int:
        return 42

    task = asyncio.create_task(watch(fence, probe, last_seq, fenced_for.append, stop, 0.02))
    await asyncio.sleep(0.3)
    assert fenced_for == [], "reachable: no fence"
    reachable = False
    await asyncio.sleep(0.4)
    assert len(fenced_for) == 1 and fenced_for[0] >= 0.2
    reachable = True
    await asyncio.sleep(0.1)
    stop.set()
    await task
    assert fence.resume_seq == 42 and fence.holds(41) and not fence.holds(42)


@pytest.mark.parametrize(
    ("lost_s", "cancel_grace_s"),
    [(10.0, 5.0), (6.0, 1.0), (60.0, 5.0), (3.0, 30.0)],
    ids=["defaults", "test-cluster", "long-timeout", "short-timeout-long-grace"],
)
def test_a_fenced_job_is_gone_before_the_node_is_lost(lost_s: float, cancel_grace_s: float) -> None:
    after_s = Settings(node_lost_timeout_s=lost_s).fence_after_s()
    interval, grace_s = plan(after_s, lost_s, cancel_grace_s)
    # noticed within two probes, then SIGTERM, SIGKILL of the command, of the group
    assert after_s + 2 * interval + 2 * grace_s < lost_s
    assert 0 < grace_s <= cancel_grace_s


def test_the_fence_defaults_to_half_the_lost_timeout_and_must_come_before_it() -> None:
    assert Settings(node_lost_timeout_s=10).fence_after_s() == 5.0
    assert Settings(node_lost_timeout_s=10, agent_fence_after_s=0).fence_after_s() == 0
    with pytest.raises(ValueError, match="less than node_lost_timeout_s"):
        Settings(node_lost_timeout_s=10, agent_fence_after_s=10)


# --- the agent ---------------------------------------------------------------------------


async def fence_running_job(log: MemoryLog, agent: Agent, job_id: str) -> RunDir:
    """Run `job_id` until it runs, then fence the agent; returns its run folder once the
    process has ended."""
    await drive(agent, log, lambda: log.state.jobs[job_id].phase == "running")
    assert agent.fence is not None and agent.fence.silence(agent.fence.last_contact + 60)
    assert agent.fence_jobs(60.0) == [(job_id, 1, 0)]
    run = RunDir(agent.runner.root, "node-a", job_id, 1)
    while agent.runner.views()[(job_id, 1, 0)].status is not Status.EXITED:
        await asyncio.sleep(0.02)
    return run


@pytest.fixture
def fence() -> Fence:
    return Fence(after_s=3.0, last_contact=0.0)


async def test_a_fenced_agent_stops_its_jobs_and_drops_ends_the_log_requeued(
    log: MemoryLog, run_root: Path, fence: Fence
) -> None:
    run_job(log, "j1", ["sleep", "30"])
    async with agent_running(log, run_root) as agent:
        agent.fence = fence
        run = await fence_running_job(log, agent, "j1")
        assert run.read_exit() == 143, "SIGTERMed"
        assert await agent.decide(log.state) == []
        assert agent.due(log.state) == ([], []), "nothing is sent while fenced"

        lose(log, "node-a")  # inventory declared the node lost meanwhile
        fence.contact(70.0)
        fence.resumed(log.state.seq)
        await drive(agent, log, lambda: agent.runner.views() == {} and not agent.outbox)

    assert finishes(log, "j1") == []
    assert log.state.jobs["j1"].phase == "queued"
    assert log.state.voided == 0


async def test_a_fenced_job_whose_node_was_not_lost_is_reported_failed(
    log: MemoryLog, run_root: Path, fence: Fence
) -> None:
    run_job(log, "j1", ["sleep", "30"])
    async with agent_running(log, run_root) as agent:
        agent.fence = fence
        await fence_running_job(log, agent, "j1")
        fence.contact(70.0)
        fence.resumed(log.state.seq)  # back before the node was declared lost
        await drive(agent, log, phase(log, "j1"))

    [finished] = finishes(log, "j1")
    assert finished.outcome == "failed"
    assert finished.reason is not None and "self-fencing" in finished.reason
    assert log.state.voided == 0


async def test_a_fenced_agent_starts_no_job_until_it_has_caught_up(
    log: MemoryLog, run_root: Path, fence: Fence
) -> None:
    async with agent_running(log, run_root) as agent:
        agent.fence = fence
        fence.silence(10.0)
        run_job(log, "j1", ["true"])  # placed in the state it had before the cut-off
        for _ in range(5):
            assert await agent.decide(log.state) == []
        assert agent.runner.views() == {}
        assert not RunDir(agent.runner.root, "node-a", "j1", 1).exists()

        fence.contact(20.0)
        fence.resumed(log.state.seq)
        await drive(agent, log, phase(log, "j1"))

    assert log.state.jobs["j1"].phase == "succeeded"


async def test_a_fenced_job_that_ignores_sigterm_is_killed_within_the_fence_grace(
    log: MemoryLog, run_root: Path
) -> None:
    run_job(log, "stubborn", ["sh", "-c", "trap '' TERM; sleep 30"])
    async with agent_running(log, run_root) as agent:  # its own grace: 1 s
        agent.fence = Fence(after_s=3.0, last_contact=0.0, grace_s=0.15)
        await drive(agent, log, lambda: log.state.jobs["stubborn"].phase == "running")
        await asyncio.sleep(0.2)  # its trap is set
        began = time.monotonic()
        agent.fence.silence(60.0)
        agent.fence_jobs(60.0)
        while agent.runner.views()[("stubborn", 1, 0)].status is not Status.EXITED:
            await asyncio.sleep(0.02)
        took = time.monotonic() - began

    assert took < 0.9, "the fence's grace, not the runner's"

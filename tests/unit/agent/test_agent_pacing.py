"""A node starts at most so many jobs a second per user (`services.agent.pacing`): a
job over its user's budget stays placed and starts on a later round; another user's
job is not held by it."""

from __future__ import annotations

from pathlib import Path

from agent_events import publish, run_job

from gpuloom.testing.memlog import MemoryLog
from services.agent.agent import Agent
from services.agent.pacing import StartBudget

ENVIRON = {"PATH": "/usr/local/bin:/usr/bin:/bin"}


def test_a_bucket_per_node_and_user_refills_at_its_rate() -> None:
    budget = StartBudget(rate=2.0, burst=3)
    assert [budget.take("n1", "mallory", 0.0) for _ in range(4)] == [True, True, True, False]
    assert budget.take("n1", "alice", 0.0) and budget.take("n2", "mallory", 0.0)
    assert not budget.take("n1", "mallory", 0.4)  # 0.8 of a start earned
    assert budget.take("n1", "mallory", 0.6)
    assert [budget.take("n1", "mallory", 100.0) for _ in range(4)] == [True, True, True, False]
    unlimited = StartBudget(rate=0.0, burst=1)
    assert all(unlimited.take("n1", "mallory", 0.0) for _ in range(100))


async def test_jobs_over_their_users_budget_wait_and_others_start(
    log: MemoryLog, run_root: Path
) -> None:
    budget = StartBudget(rate=0.001, burst=2)
    agent = Agent(["node-a"], run_root, grace_s=1.0, poll_s=0.02, environ=ENVIRON, budget=budget)
    for index in range(4):
        run_job(log, f"m{index}", ["sleep", "5"], user="mallory")
    run_job(log, "a0", ["sleep", "5"], user="alice")
    try:
        decisions = await agent.decide(log.state)
        started = sorted(d.event.job_id for d in decisions if d.event.TYPE == "JobStarted")
        assert started == ["a0", "m0", "m1"]
        await publish(log, decisions)
        again = await agent.decide(log.state)
        assert not [d for d in again if d.event.TYPE == "JobStarted"], "still over budget"
        budget.buckets.clear()  # a full bucket again, as after 2,000 s at this rate
        later = await agent.decide(log.state)
        assert sorted(d.event.job_id for d in later if d.event.TYPE == "JobStarted") == ["m2", "m3"]
    finally:
        for key in list(agent.runner.views()):
            agent.runner.drop(key)

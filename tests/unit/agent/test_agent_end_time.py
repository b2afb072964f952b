"""A job's end carries when the job ended (its shim's `exit` file), not when the agent
reported it: a job that ends while its agent is down is charged up to its own end."""

from __future__ import annotations

import asyncio
import time
from datetime import UTC, datetime
from pathlib import Path

from agent_events import recorded, run_job
from test_agent_flow import agent_running, drive, finishes, phase

from gpuloom.testing.memlog import MemoryLog
from services.agent.shim import RunDir, ended


def test_the_exit_time_is_when_the_shim_wrote_the_exit_status(tmp_path: Path) -> None:
    run = RunDir(tmp_path, "node-a", "j1", 1)
    run.create()
    assert run.exit_time() is None
    before = datetime.now(UTC)
    run.file("exit").write_text("0\n")

    at = run.exit_time()

    assert at is not None and before.timestamp() - 0.05 <= at.timestamp() <= time.time() + 0.05
    assert ended(run.read_exit(), run.read_reason(), at).at == at
    assert ended(None, None, at).at is None, "a lost process has no known end"


def test_an_exit_status_is_final_only_with_its_newline(tmp_path: Path) -> None:
    """The shim writes `exit` in place (no `mv` process per job): a read between the
    shell's open and its write finds nothing, or (never seen, but allowed) part of it."""
    run = RunDir(tmp_path, "node-a", "j1", 1)
    run.create()
    for partial in ["", "14", "1"]:
        run.file("exit").write_text(partial)
        assert run.read_exit() is None and not run.has_exit(), partial
    run.file("exit").write_text("143\n")
    assert run.read_exit() == 143 and run.has_exit()


async def test_a_job_that_ended_while_its_agent_was_down_reports_its_own_end(
    log: MemoryLog, run_root: Path
) -> None:
    run_job(log, "j1", ["sh", "-c", "sleep 0.3"], gpus=1, gpu_indexes=[0])
    async with agent_running(log, run_root, watch=False) as first:
        await drive(first, log, lambda: log.state.jobs["j1"].phase == "running")
    run = RunDir(run_root.resolve(), "node-a", "j1", 1)
    while run.read_exit() is None:  # the job ends unwatched...
        await asyncio.sleep(0.02)
    await asyncio.sleep(1.5)  # ...and the agent comes back well after

    async with agent_running(log, run_root) as second:
        second.runner.scan(["node-a"])
        await drive(second, log, phase(log, "j1"))

    [finished] = finishes(log, "j1")
    exit_time = run.exit_time()
    assert finished.ended_at == exit_time and exit_time is not None
    reported = recorded(log)[-1].envelope.at
    assert (reported - exit_time).total_seconds() >= 1.4
    [run_state] = log.state.jobs["j1"].runs
    assert run_state.ended_at == exit_time
    assert 0 < run_state.seconds <= 1.2, "charged for the job's time, not the agent's absence"

"""One bad job costs that job, never the agent's round: a command `execve` refuses is
reported failed with the reason, and the other jobs of the node run, end and cancel.

The contract (and the gateway) refuse NUL in argv and env; these jobs are built
past that validation, as a writer that did not check would have them (`place_unchecked`).
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
from agent_events import cancel, place, run_job, types_of, write
from test_agent_flow import agent_running, drive, finishes, phase

from gpuloom.events import JobAdmitted, JobQueued, JobSpec, JobSubmitted
from gpuloom.state.retention import final_phase
from gpuloom.testing.memlog import MemoryLog
from services.agent.jobenv import spawn_problem
from services.agent.outcomes import NotStarted
from services.agent.reconcile import Ensure
from services.agent.runner import Runner
from services.agent.shim import RunDir

#: A word `execve` refuses (with its `NAME=`, one environment string over the kernel's
#: 128 KiB limit, MAX_ARG_STRLEN): the contract refuses it too, so it comes unchecked.
TOO_LONG = "a" * (128 * 1024)


def place_unchecked(log: MemoryLog, job_id: str, **spec: object) -> None:
    """Submit, admit, queue and place a job whose spec skipped validation.

    The log's readers check the contract as they decode (such a JobSubmitted would be
    dead-lettered), so the job goes on the log valid and its spec is replaced in the
    log's fold, which the agent decides on."""
    valid = JobSpec(name=job_id, user="ann", account="research", command=["true"], gpus=0)
    write(log, JobSubmitted(job_id=job_id, spec=valid))
    write(log, JobAdmitted(job_id=job_id))
    write(log, JobQueued(job_id=job_id, priority=0))
    place(log, job_id)
    log.state.jobs[job_id].spec = valid.model_copy(update=spec)


@pytest.mark.parametrize(
    ("command", "env", "reason"),
    [
        (["sh", "-c", "a\0b"], {}, "could not start: embedded null byte in argv[2]"),
        (["true"], {"GPULOOM_X": "a\0b"}, "could not start: embedded null byte in env GPULOOM_X"),
        (["true"], {"A=B": "x"}, "could not start: invalid env variable name 'A=B'"),
        (["true"], {"X": 7}, "could not start: int instead of text in env X"),
        (["true"], {"X": "\ud800"}, "could not start: text that is not valid Unicode in env X"),
        (["true"], {"X": "line\nbreak"}, None),
    ],
    ids=["nul-in-argv", "nul-in-env", "equals-in-name", "not-text", "lone-surrogate", "fine"],
)
def test_spawn_problem_names_the_word_execve_refuses(
    command: list[str], env: dict[str, str], reason: str | None
) -> None:
    assert spawn_problem(command, env) == reason


async def test_a_job_that_cannot_start_fails_and_the_node_goes_on(
    log: MemoryLog, run_root: Path
) -> None:
    run_job(log, "long", ["sleep", "30"])
    place_unchecked(log, "nul", env={"TOKEN": "secret\0value"})
    place_unchecked(log, "huge", env={"X": TOO_LONG})  # over execve's limit
    run_job(log, "good", ["sh", "-c", "echo ok"])

    async with agent_running(log, run_root) as agent:
        await drive(
            agent,
            log,
            lambda: (
                all(phase(log, j)() for j in ("nul", "huge", "good"))
                and log.state.jobs["long"].phase == "running"
            ),
        )
        cancel(log, "long")
        await drive(agent, log, phase(log, "long"))

    state = log.state  # jobs that ended and were charged are tombstones by now
    assert {j: final_phase(state, j) for j in ("nul", "huge", "good", "long")} == {
        "nul": "failed",
        "huge": "failed",
        "good": "succeeded",
        "long": "cancelled",
    }
    [nul], [huge] = finishes(log, "nul"), finishes(log, "huge")
    assert nul.reason == "could not start: embedded null byte in env TOKEN"
    assert huge.reason == "could not start: Argument list too long"
    assert "secret" not in (nul.reason or "")
    assert types_of(log, "nul") == [
        "JobSubmitted", "JobAdmitted", "JobQueued", "JobPlaced", "JobFinished",
    ]  # fmt: skip
    assert [f.exit_code for f in finishes(log, "nul") + finishes(log, "huge")] == [
        None,
        None,
    ]
    assert log.state.voided == 0


def test_a_spawn_refused_for_good_is_not_started_and_the_folder_says_why(
    run_root: Path,
) -> None:
    runner = Runner(run_root, lambda exited: None, environ={"PATH": "/usr/bin:/bin"})
    valid = JobSpec(name="huge", user="ann", account="research", command=["true"], gpus=0)
    spec = valid.model_copy(update={"env": {"X": TOO_LONG}})
    action = Ensure("huge", 1, "node-a", "placed", spec, (), (), None)

    result = runner.ensure(action)

    assert isinstance(result, NotStarted)
    assert result.ended.reason == "could not start: Argument list too long"
    run = RunDir(runner.root, "node-a", "huge", 1)
    assert run.read_reason() == ("failed", "could not start: Argument list too long")
    assert runner.views() == {}


async def test_a_transient_spawn_error_is_retried_not_reported(
    log: MemoryLog, run_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import services.agent.launching as launching

    real_spawn = launching.spawn_shim
    calls: list[int] = []

    def disk_full_once(*args: object, **kwargs: object) -> int:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_spawn(*args, **kwargs)

    monkeypatch.setattr(launching, "spawn_shim", disk_full_once)
    run_job(log, "j1", ["true"])

    async with agent_running(log, run_root) as agent:
        await drive(agent, log, phase(log, "j1"))

    assert len(calls) == 2
    assert log.state.jobs["j1"].phase == "succeeded"


async def test_an_action_that_raises_costs_only_its_job(
    log: MemoryLog, run_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    run_job(log, "a", ["sleep", "30"])
    run_job(log, "b", ["sleep", "30"])

    async with agent_running(log, run_root) as agent:
        running = ("a", "b")
        await drive(agent, log, lambda: all(log.state.jobs[j].phase == "running" for j in running))
        real_stop = agent.runner.stop

        def stop(key: tuple[str, int, int], *args: str, **kw: bool) -> None:
            if key[0] == "a":
                raise RuntimeError("a bug in one action")
            real_stop(key, *args, **kw)

        agent.runner.stop = stop
        cancel(log, "a")
        cancel(log, "b")
        with caplog.at_level(logging.ERROR, logger="services.agent.agent"):
            await drive(agent, log, phase(log, "b"))
        agent.runner.stop = real_stop
        await drive(agent, log, phase(log, "a"))

    assert log.state.jobs["b"].phase == "cancelled"
    assert log.state.jobs["a"].phase == "cancelled"
    assert any("job a:" in r.getMessage() and r.exc_info for r in caplog.records)

"""One bad job costs that job, never the agent's round: a command `execve` refuses is
reported failed with the reason, and the other jobs of the node run, end and cancel.

The contract (and the gateway) refuse NUL in argv and env; these jobs are built
past that validation, as a writer that did not check would put them on the bus.
"""

from __future__ import annotations

import errno
import logging
from pathlib import Path

import pytest
from agent_fakelog import FakeLog
from test_agent_flow import agent_running, drive, finishes, phase

from gpuloom.events import JobAdmitted, JobQueued, JobSpec, JobSubmitted
from gpuloom.state.retention import final_phase
from services.agent.jobenv import spawn_problem
from services.agent.outcomes import NotStarted
from services.agent.reconcile import Ensure
from services.agent.runner import Runner
from services.agent.shim import RunDir

#: A word `execve` refuses (with its `NAME=`, one environment string over the kernel's
#: 128 KiB limit, MAX_ARG_STRLEN): the contract refuses it too, so it comes unchecked.
TOO_LONG = "a" * (128 * 1024)


def place_unchecked(fake_log: FakeLog, job_id: str, **spec: object) -> None:
    """Submit, admit, queue and place a job whose spec skipped validation."""
    valid = JobSpec(name=job_id, user="ann", account="research", command=["true"], gpus=0)
    fake_log.append(JobSubmitted(job_id=job_id, spec=valid.model_copy(update=spec)))
    fake_log.append(JobAdmitted(job_id=job_id))
    fake_log.append(JobQueued(job_id=job_id, priority=0))
    fake_log.place(job_id)


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
    fake_log: FakeLog, run_root: Path
) -> None:
    fake_log.run("long", ["sleep", "30"])
    place_unchecked(fake_log, "nul", env={"TOKEN": "secret\0value"})
    place_unchecked(fake_log, "huge", env={"X": TOO_LONG})  # over execve's limit
    fake_log.run("good", ["sh", "-c", "echo ok"])

    async with agent_running(fake_log, run_root) as agent:
        await drive(
            agent,
            fake_log,
            lambda: (
                all(phase(fake_log, j)() for j in ("nul", "huge", "good"))
                and fake_log.state.jobs["long"].phase == "running"
            ),
        )
        fake_log.cancel("long")
        await drive(agent, fake_log, phase(fake_log, "long"))

    state = fake_log.state  # jobs that ended and were charged are tombstones by now
    assert {j: final_phase(state, j) for j in ("nul", "huge", "good", "long")} == {
        "nul": "failed",
        "huge": "failed",
        "good": "succeeded",
        "long": "cancelled",
    }
    [nul], [huge] = finishes(fake_log, "nul"), finishes(fake_log, "huge")
    assert nul.reason == "could not start: embedded null byte in env TOKEN"
    assert huge.reason == "could not start: Argument list too long"
    assert "secret" not in (nul.reason or "")
    assert fake_log.types_of("nul") == [
        "JobSubmitted", "JobAdmitted", "JobQueued", "JobPlaced", "JobFinished",
    ]  # fmt: skip
    assert [f.exit_code for f in finishes(fake_log, "nul") + finishes(fake_log, "huge")] == [
        None,
        None,
    ]
    assert fake_log.state.voided == 0


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
    fake_log: FakeLog, run_root: Path, monkeypatch: pytest.MonkeyPatch
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
    fake_log.run("j1", ["true"])

    async with agent_running(fake_log, run_root) as agent:
        await drive(agent, fake_log, phase(fake_log, "j1"))

    assert len(calls) == 2
    assert fake_log.state.jobs["j1"].phase == "succeeded"


async def test_an_action_that_raises_costs_only_its_job(
    fake_log: FakeLog, run_root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake_log.run("a", ["sleep", "30"])
    fake_log.run("b", ["sleep", "30"])

    async with agent_running(fake_log, run_root) as agent:
        running = ("a", "b")
        await drive(
            agent, fake_log, lambda: all(fake_log.state.jobs[j].phase == "running" for j in running)
        )
        real_stop = agent.runner.stop

        def stop(key: tuple[str, int, int], *args: str) -> None:
            if key[0] == "a":
                raise RuntimeError("a bug in one action")
            real_stop(key, *args)

        agent.runner.stop = stop
        fake_log.cancel("a")
        fake_log.cancel("b")
        with caplog.at_level(logging.ERROR, logger="services.agent.agent"):
            await drive(agent, fake_log, phase(fake_log, "b"))
        agent.runner.stop = real_stop
        await drive(agent, fake_log, phase(fake_log, "a"))

    assert fake_log.state.jobs["b"].phase == "cancelled"
    assert fake_log.state.jobs["a"].phase == "cancelled"
    assert any("job a:" in r.getMessage() and r.exc_info for r in caplog.records)

"""The runner with real processes: exits, environment, time limits, stops, restarts."""

from __future__ import annotations

import asyncio
import os
import pwd
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpuloom.events import JobSpec
from gpuloom.events.jobs import CheckpointSignal
from services.agent.outcomes import Exited, NotStarted, Resumed, Started
from services.agent.reconcile import Ensure, Status
from services.agent.runner import Runner
from services.agent.shim import Ended, RunDir
from services.agent.uids import DEFAULT_UID_RANGE, allocate, is_local_id

GRACE_S = 1.0
ENVIRON = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": "/home/ann", "SECRET": "x"}
#: Who jobs of user "ann" run as here: for an agent that is root, ann's own uid from
#: the default range (gid the same, no passwd entry), else the agent's own user.
JOB_USER = (
    pwd.struct_passwd(("ann", "x", ANN_UID, ANN_UID, "", "", ""))
    if os.geteuid() == 0 and (ANN_UID := allocate("ann", {}, DEFAULT_UID_RANGE, is_local_id))
    else pwd.getpwuid(os.geteuid())
)


def ensure(
    job_id: str,
    command: list[str],
    *,
    attempt: int = 1,
    phase: str = "placed",
    gpu_indexes: tuple[int, ...] = (),
    time_limit_s: int | None = None,
    env: dict[str, str] | None = None,
    started_at: datetime | None = None,
    signal: CheckpointSignal | None = None,
) -> Ensure:
    spec = JobSpec(
        name=job_id,
        user="ann",
        account="research",
        command=command,
        gpus=len(gpu_indexes),
        time_limit_s=time_limit_s,
        env=env or {},
        signal=signal,
    )
    return Ensure(
        job_id=job_id,
        attempt=attempt,
        node="node-a",
        phase=phase,
        spec=spec,
        gpu_indexes=gpu_indexes,
        gpu_uuids=tuple(f"GPU-{i}" for i in gpu_indexes),
        started_at=started_at,
    )


class Harness:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.exits: list[Exited] = []
        self.runner = Runner(root, self.exits.append, grace_s=GRACE_S, poll_s=0.02, environ=ENVIRON)

    def start(self, action: Ensure) -> int:
        """Start a job and wait until its shim is up (it has written its pid)."""
        result = self.runner.ensure(action)
        assert isinstance(result, Started), result
        run = RunDir(self.runner.root, action.node, *action.key)
        while run.read_pid() is None:
            time.sleep(0.005)
        return result.pid

    async def ended(self, job_id: str, attempt: int = 1, timeout: float = 8.0) -> Exited:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.runner.poll()
            for exited in self.exits:
                if exited.key == (job_id, attempt, 0):
                    return exited
            await asyncio.sleep(0.02)
        raise AssertionError(f"{job_id} did not end within {timeout} s")

    def output(self, job_id: str, name: str = "stdout", attempt: int = 1) -> str:
        return RunDir(self.root, "node-a", job_id, attempt).file(name).read_text()


@pytest.fixture
def harness(run_root: Path) -> Harness:
    return Harness(run_root)


def live_members(group: int) -> list[int]:
    """Processes of a process group that are not zombies (this machine's init may reap late)."""
    members = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == group and fields[0] != "Z":
            members.append(int(stat.parent.name))
    return members


def group_is_gone(pid: int) -> bool:
    """Whether no live process of group `pid` is left, within five seconds."""
    for _ in range(250):
        if not live_members(pid):
            return True
        time.sleep(0.02)
    return False


async def test_exit_zero_succeeds_and_output_is_captured(harness: Harness) -> None:
    pid = harness.start(ensure("ok", ["sh", "-c", "echo to-out; echo to-err >&2"]))

    exited = await harness.ended("ok")

    assert exited == Exited(("ok", 1, 0), "node-a", pid, Ended("succeeded", 0, None))
    assert harness.output("ok") == "to-out\n"
    assert harness.output("ok", "stderr") == "to-err\n"
    assert harness.output("ok", "pid").strip() == str(pid)
    assert harness.runner.views()[("ok", 1, 0)].status is Status.EXITED


async def test_a_non_zero_exit_fails_with_its_code(harness: Harness) -> None:
    harness.start(ensure("three", ["sh", "-c", "exit 3"]))

    assert (await harness.ended("three")).ended == Ended("failed", 3, "exit code 3")


async def test_death_by_signal_is_named(harness: Harness) -> None:
    harness.start(ensure("nine", ["sh", "-c", "kill -9 $$"]))

    assert (await harness.ended("nine")).ended == Ended("failed", 137, "killed by signal 9")


async def test_the_job_sees_its_gpus_its_identity_and_a_minimal_environment(
    harness: Harness,
) -> None:
    show = "env | sort; id -u; pwd"
    harness.start(ensure("envy", ["sh", "-c", show], gpu_indexes=(1, 3), env={"LR": "0.1"}))
    harness.start(ensure("cpu", ["sh", "-c", show], attempt=2))

    await harness.ended("envy")
    await harness.ended("cpu", attempt=2)
    lines = harness.output("envy").splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    assert env["CUDA_VISIBLE_DEVICES"] == "1,3"
    assert env["GPULOOM_GPU_UUIDS"] == "GPU-1,GPU-3"
    assert (env["GPULOOM_JOB_ID"], env["GPULOOM_NODE"], env["GPULOOM_ATTEMPT"]) == (
        "envy",
        "node-a",
        "1",
    )
    work = RunDir(harness.runner.root, "node-a", "envy", 1).work
    assert env["LR"] == "0.1" and env["HOME"] == str(work)
    assert env["USER"] == env["LOGNAME"] == JOB_USER.pw_name
    assert "SECRET" not in env
    assert lines[-2:] == [str(JOB_USER.pw_uid), str(work)]
    assert "CUDA_VISIBLE_DEVICES=\n" in harness.output("cpu", attempt=2)


async def test_a_reserved_name_in_an_old_events_env_cannot_win(harness: Harness) -> None:
    planted = {
        "CUDA_VISIBLE_DEVICES": "7",
        "GPULOOM_JOB_ID": "someone-else",
        "GPULOOM_REPLICA": "3",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100",
        "LD_PRELOAD": "/nowhere/inject.so",
        "LD_LIBRARY_PATH": "/opt/cuda/lib64",
    }
    harness.start(ensure("old", ["sh", "-c", "env | sort"], gpu_indexes=(0,), env=planted))

    assert (await harness.ended("old")).ended.outcome == "succeeded"
    lines = harness.output("old").splitlines()
    env = dict(line.split("=", 1) for line in lines if "=" in line)
    assert (env["CUDA_VISIBLE_DEVICES"], env["GPULOOM_JOB_ID"]) == ("0", "old")
    assert not {"GPULOOM_REPLICA", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "LD_PRELOAD"} & set(env)
    assert env["LD_LIBRARY_PATH"] == "/opt/cuda/lib64"  # the one LD_* a job may set
    assert harness.output("old", "stderr") == ""


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as another account only under root")
async def test_a_job_writes_only_its_own_working_directory(harness: Harness) -> None:
    harness.start(ensure("first", ["sleep", "30"]))
    probe = (
        "touch mine && echo own-ok; "
        "touch ../exit.forged 2>/dev/null && echo forged-own-record; "
        "touch ../../../first/1/pid.forged 2>/dev/null && echo wrote-other-run-folder; "
        "ls ../../../first/1/pid >/dev/null && (echo 1 >> ../../../first/1/pid) 2>/dev/null "
        "&& echo forged-other-record; "
        "ls -ld . | cut -c1-10; "
        "echo its-own-log > /dev/stderr"
    )
    harness.start(ensure("second", ["sh", "-c", probe]))

    assert (await harness.ended("second")).ended.outcome == "succeeded"
    out = harness.output("second")
    assert out.splitlines() == ["own-ok", "drwx------"]
    assert harness.output("second", "stderr") == "its-own-log\n"
    work = RunDir(harness.runner.root, "node-a", "second", 1).work
    assert (work / "mine").stat().st_uid == JOB_USER.pw_uid
    assert not (work.parent / "exit.forged").exists()
    harness.runner.stop(("first", 1, 0), "cancelled", "test over")
    await harness.ended("first")


@pytest.mark.skipif(os.geteuid() != 0, reason="jobs run as another account only under root")
async def test_a_program_the_jobs_account_may_not_execute_fails_as_the_shell_would(
    harness: Harness, tmp_path: Path
) -> None:
    private = tmp_path / "root-only"
    private.write_text("#!/bin/sh\necho ran\n")
    private.chmod(0o700)  # root may run it (the agent checks as root); the job may not
    harness.start(ensure("denied", [str(private)]))

    assert (await harness.ended("denied")).ended == Ended("failed", 126, "exit code 126")
    assert "Permission denied" in harness.output("denied", "stderr")
    assert not RunDir(harness.runner.root, "node-a", "denied", 1).file("launch").exists()


async def test_a_job_over_its_time_limit_is_timed_out(harness: Harness) -> None:
    began = time.monotonic()
    pid = harness.start(ensure("slow", ["sleep", "30"], time_limit_s=1))

    exited = await harness.ended("slow")

    assert exited.ended == Ended("timed_out", 143, "time limit of 1 s exceeded")
    assert 1.0 <= time.monotonic() - began < 3.0
    assert group_is_gone(pid)


#: A job that says when it gets USR1 and TERM (and ends at TERM), as a checkpointing one.
CHECKPOINTING = (
    "trap 'echo got USR1' USR1; trap 'echo got TERM; exit 143' TERM; echo ready; "
    "while :; do sleep 0.05; done"
)


async def seen(harness: Harness, job_id: str, text: str, timeout: float = 8.0) -> float:
    """When `text` appeared in the job's output (the test's monotonic clock)."""
    deadline = time.monotonic() + timeout
    while text not in harness.output(job_id):
        assert time.monotonic() < deadline, harness.output(job_id)
        harness.runner.poll()  # what the agent's loop does: the signal's time may come
        await asyncio.sleep(0.02)
    return time.monotonic()


async def test_a_checkpoint_signal_comes_its_seconds_before_the_time_limit(
    harness: Harness,
) -> None:
    usr1 = CheckpointSignal(name="USR1", before_s=2)
    began = time.monotonic()
    harness.start(ensure("limited", ["sh", "-c", CHECKPOINTING], time_limit_s=3, signal=usr1))
    warned = await seen(harness, "limited", "got USR1")
    exited = await harness.ended("limited")
    assert 0.8 <= warned - began < 2.0, "at the limit less before_s"
    assert exited.ended.outcome == "timed_out"
    assert harness.output("limited").count("got USR1") == 1
    assert harness.output("limited").index("got USR1") < harness.output("limited").index("got TERM")


async def test_a_preemption_sends_the_checkpoint_signal_then_sigterm_its_seconds_later(
    harness: Harness,
) -> None:
    usr1 = CheckpointSignal(name="USR1", before_s=2)
    harness.start(ensure("trainer", ["sh", "-c", CHECKPOINTING], signal=usr1))
    await seen(harness, "trainer", "ready")
    harness.runner.stop(("trainer", 1, 0), "preempted", "GPU node-a/0 failed", checkpoint=True)
    warned = await seen(harness, "trainer", "got USR1")
    termed = await seen(harness, "trainer", "got TERM")
    exited = await harness.ended("trainer")
    assert termed - warned >= 1.8, "SIGTERM waits before_s after the signal"
    assert exited.ended == Ended("preempted", 143, "GPU node-a/0 failed")


async def test_a_users_cancel_sends_no_checkpoint_signal(harness: Harness) -> None:
    usr1 = CheckpointSignal(name="USR1", before_s=2)
    harness.start(ensure("quick", ["sh", "-c", CHECKPOINTING], signal=usr1))
    await seen(harness, "quick", "ready")
    harness.runner.stop(("quick", 1, 0), "cancelled", "cancelled by user", checkpoint=False)
    await harness.ended("quick")
    assert "got USR1" not in harness.output("quick")


async def test_cancel_sends_sigterm_then_sigkill_to_a_job_that_ignores_it(
    harness: Harness,
) -> None:
    stubborn = "trap 'echo got TERM' TERM; echo ready; while :; do sleep 0.05; done"
    pid = harness.start(ensure("stubborn", ["sh", "-c", stubborn]))
    while "ready" not in harness.output("stubborn"):
        await asyncio.sleep(0.02)
    began = time.monotonic()

    harness.runner.stop(("stubborn", 1, 0), "cancelled", "cancelled by user")
    exited = await harness.ended("stubborn")

    assert exited.ended == Ended("cancelled", 137, "cancelled by user")
    assert time.monotonic() - began >= GRACE_S
    assert harness.output("stubborn").count("got TERM") == 1
    assert group_is_gone(pid)


async def test_cancel_of_a_well_behaved_job_ends_it_at_once(harness: Harness) -> None:
    harness.start(ensure("polite", ["sleep", "30"]))
    began = time.monotonic()

    harness.runner.stop(("polite", 1, 0), "cancelled", "cancelled by user")

    assert (await harness.ended("polite")).ended == Ended("cancelled", 143, "cancelled by user")
    assert time.monotonic() - began < GRACE_S


async def test_a_dropped_job_is_killed_without_a_report(harness: Harness) -> None:
    pid = harness.start(ensure("gone", ["sleep", "30"]))

    harness.runner.drop(("gone", 1, 0))
    for _ in range(250):  # up to 5 s: a loaded machine may take more than one to reap it
        harness.runner.poll()
        if ("gone", 1, 0) not in harness.runner.views():
            break
        await asyncio.sleep(0.02)

    assert ("gone", 1, 0) not in harness.runner.views()
    assert harness.exits == []
    assert group_is_gone(pid)


@pytest.mark.parametrize(
    ("command", "code", "reason"),
    [
        (["no-such-program", "x"], 127, "cannot run command: no-such-program: command not found"),
        (["/no/such/file"], 127, "cannot run command: /no/such/file: no such file"),
        (["DATA"], 126, "permission denied"),
    ],
    ids=["not on PATH", "no such path", "not executable"],
)
def test_a_command_that_cannot_run_is_not_started(
    harness: Harness, command: list[str], code: int, reason: str
) -> None:
    data = harness.root.parent / "data.txt"
    data.write_text("not a program")
    command = [str(data) if word == "DATA" else word for word in command]
    result = harness.runner.ensure(ensure("bad", command))

    assert isinstance(result, NotStarted)
    assert result.ended.exit_code == code
    assert result.ended.reason is not None and result.ended.reason.endswith(reason)
    assert harness.runner.views() == {}
    assert not RunDir(harness.runner.root, "node-a", "bad", 1).exists()


async def test_a_new_runner_adopts_a_still_running_shim(run_root: Path) -> None:
    first = Harness(run_root)
    pid = first.start(ensure("long", ["sh", "-c", "sleep 0.7; echo done; exit 4"]))
    del first  # the agent is killed: its shims live on

    second = Harness(run_root)
    assert second.runner.scan(["node-a"]) == 1
    assert second.runner.views()[("long", 1, 0)].status is Status.ORPHAN
    assert second.runner.ensure(ensure("long", ["x"], phase="running")) == Resumed(pid)
    assert second.runner.views()[("long", 1, 0)].status is Status.RUNNING

    exited = await second.ended("long")
    assert exited == Exited(("long", 1, 0), "node-a", pid, Ended("failed", 4, "exit code 4"))
    assert second.output("long") == "done\n"


async def test_an_agent_restarted_after_the_checkpoint_signal_does_not_send_it_again(
    run_root: Path,
) -> None:
    usr1 = CheckpointSignal(name="USR1", before_s=2)
    first = Harness(run_root)
    first.start(ensure("trainer", ["sh", "-c", CHECKPOINTING], signal=usr1))
    await seen(first, "trainer", "ready")
    first.runner.stop(("trainer", 1, 0), "preempted", "preempted by urgent", checkpoint=True)
    await seen(first, "trainer", "got USR1")
    del first  # the agent is killed after the signal, before its SIGTERM

    second = Harness(run_root)
    second.runner.scan(["node-a"])
    second.runner.ensure(ensure("trainer", ["x"], phase="running", signal=usr1))
    second.runner.stop(("trainer", 1, 0), "preempted", "preempted by urgent", checkpoint=True)
    exited = await second.ended("trainer")
    assert exited.ended == Ended("preempted", 143, "preempted by urgent")
    assert second.output("trainer").count("got USR1") == 1, "the signal came once"


async def test_an_adopted_job_keeps_its_time_limit_from_its_start(run_root: Path) -> None:
    first = Harness(run_root)
    first.start(ensure("limited", ["sleep", "30"], time_limit_s=2))

    second = Harness(run_root)
    second.runner.scan(["node-a"])
    began_long_ago = datetime.now(UTC) - timedelta(seconds=1.7)
    action = ensure("limited", ["x"], phase="running", time_limit_s=2, started_at=began_long_ago)
    second.runner.ensure(action)
    began = time.monotonic()

    exited = await second.ended("limited")
    assert exited.ended == Ended("timed_out", 143, "time limit of 2 s exceeded")
    assert time.monotonic() - began < 1.0


async def test_a_new_runner_reports_an_end_recorded_while_no_agent_watched(
    run_root: Path,
) -> None:
    first = Harness(run_root)
    pid = first.start(ensure("quick", ["true"]))
    run = RunDir(first.runner.root, "node-a", "quick", 1)
    while run.read_exit() is None:
        await asyncio.sleep(0.02)

    second = Harness(run_root)
    assert second.runner.scan(["node-a"]) == 0
    assert second.runner.ensure(ensure("quick", ["true"], phase="running")) == Resumed(None)

    assert second.exits == [Exited(("quick", 1, 0), "node-a", pid, Ended("succeeded", 0, None))]


def test_a_run_folder_without_a_live_shim_or_an_exit_is_lost(harness: Harness) -> None:
    run = RunDir(harness.runner.root, "node-a", "lost", 1)
    run.create()
    run.file("stdout").write_text("")
    run.file("pid").write_text("999999999\n")

    assert harness.runner.ensure(ensure("lost", ["true"], phase="running")) == Resumed(None)
    assert harness.runner.ensure(ensure("never", ["true"], phase="running")) == Resumed(None)

    assert [(e.key[0], e.ended) for e in harness.exits] == [
        ("lost", Ended("failed", None, "agent lost the process")),
        ("never", Ended("failed", None, "agent lost the process")),
    ]


def test_a_stop_recorded_before_the_agent_died_decides_the_outcome(harness: Harness) -> None:
    run = RunDir(harness.runner.root, "node-a", "stopped", 1)
    run.create()
    run.file("stdout").write_text("")
    run.file("exit").write_text("143\n")
    run.write_reason("timed_out", "time limit of 5 s exceeded")

    harness.runner.ensure(ensure("stopped", ["true"], phase="running"))

    assert harness.exits[0].ended == Ended("timed_out", 143, "time limit of 5 s exceeded")


async def test_a_stop_waits_at_most_the_agents_bound_after_the_signal(harness: Harness) -> None:
    """A job asking for an hour's warning cannot hold up a preemption for an hour."""
    harness.runner.checkpoint_most_s = 0.5
    usr1 = CheckpointSignal(name="USR1", before_s=3600)
    harness.start(ensure("greedy", ["sh", "-c", CHECKPOINTING], signal=usr1))
    await seen(harness, "greedy", "ready")
    harness.runner.stop(("greedy", 1, 0), "preempted", "preempted by b", checkpoint=True)
    warned = await seen(harness, "greedy", "got USR1")
    termed = await seen(harness, "greedy", "got TERM")
    assert 0.3 <= termed - warned < 2.0

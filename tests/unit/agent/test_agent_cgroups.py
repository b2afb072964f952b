"""Per-job cgroups: paths and limits (pure), and real groups where the host has them."""

from __future__ import annotations

import asyncio
import os
import time
from pathlib import Path

import pytest

from gpuloom.events import JobSpec
from services.agent.cgroups import (
    MIB,
    Cgroups,
    JobGroup,
    Limits,
    detect,
    hidden_processes,
    limits_for,
    read_record,
)
from services.agent.hiding import process_hiding
from services.agent.outcomes import Exited, Started
from services.agent.reconcile import Ensure
from services.agent.runner import Runner
from services.agent.shim import RunDir

HYBRID_MOUNTS = """\
proc /proc proc rw,relatime 0 0
cgroup /sys/fs/cgroup/memory cgroup rw,relatime,memory 0 0
cgroup /sys/fs/cgroup/pids cgroup rw,relatime,pids 0 0
cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,relatime,cpu,cpuacct 0 0
cgroup /sys/fs/cgroup/freezer cgroup rw,relatime,freezer 0 0
cgroup2 /sys/fs/cgroup/unified cgroup2 rw,relatime 0 0
"""
OWN = "4:memory:/agent.service\n3:pids:/\n2:cpu,cpuacct:/x\n1:freezer:/\n0::/agent.service\n"


def spec(**fields: object) -> JobSpec:
    body: dict[str, object] = {"name": "j", "user": "ann", "account": "a", "command": ["true"]}
    return JobSpec.model_validate({"gpus": 0, **body, **fields})


@pytest.mark.parametrize(
    ("fields", "max_pids", "limits"),
    [
        ({}, 4096, Limits(None, None, 4096)),
        ({"memory_mib": 16, "cpu_milli": 500}, 0, Limits(16 * MIB, 50_000, None)),
        ({"cpu_milli": 1}, 64, Limits(None, 1_000, 64)),
        ({"cpu_milli": 4000}, 64, Limits(None, 400_000, 64)),
    ],
    ids=["nothing asked", "memory and half a cpu", "a milli-cpu gets the kernel's least", "4 cpus"],
)
def test_limits_come_from_the_request(
    fields: dict[str, object], max_pids: int, limits: Limits
) -> None:
    assert limits_for(spec(**fields), max_pids) == limits


def test_a_jobs_group_is_in_every_hierarchy_under_the_agents_own(tmp_path: Path) -> None:
    cgroups = Cgroups(
        1, (("memory", tmp_path / "memory/agent/gpuloom"), ("pids", tmp_path / "pids/gpuloom"))
    )
    group = cgroups.group("node-a", "job1", 3, 1, spec(memory_mib=2))

    assert group.folders == [
        tmp_path / "memory/agent/gpuloom/node-a/job1-3.r1",
        tmp_path / "pids/gpuloom/node-a/job1-3.r1",
    ]
    assert read_record(group.record(), group.limits) == group
    assert read_record("") is None and read_record("1\nmemory relative/path\n") is None


def test_detect_finds_v1_hierarchies_on_a_hybrid_host(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(Path, "mkdir", lambda self, **kw: None)

    cgroups, said = detect(100, HYBRID_MOUNTS, OWN)

    assert cgroups is not None and cgroups.version == 1, said
    assert dict(cgroups.bases) == {
        "memory": Path("/sys/fs/cgroup/memory/agent.service/gpuloom"),
        "pids": Path("/sys/fs/cgroup/pids/gpuloom"),
        "cpu": Path("/sys/fs/cgroup/cpu,cpuacct/x/gpuloom"),
        "freezer": Path("/sys/fs/cgroup/freezer/gpuloom"),
    }
    assert "pids.max 100" in said


def test_detect_gives_up_with_a_reason_when_not_root(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "geteuid", lambda: 1000)

    assert detect(100, HYBRID_MOUNTS, OWN) == (None, "the agent is not root")


def test_the_limits_are_written_where_v1_and_v2_read_them(tmp_path: Path) -> None:
    limits = Limits(16 * MIB, 1_000, 32)
    v1 = JobGroup(
        1, (("memory", tmp_path / "m"), ("pids", tmp_path / "p"), ("cpu", tmp_path / "c")), limits
    )
    for _, path in v1.dirs:  # what the kernel makes: the files exist
        path.mkdir()
    for name in (
        "m/memory.limit_in_bytes",
        "p/pids.max",
        "c/cpu.cfs_period_us",
        "c/cpu.cfs_quota_us",
    ):
        (tmp_path / name).write_text("")
    v2 = JobGroup(2, (("", tmp_path / "v2"),), limits)
    (tmp_path / "v2").mkdir()
    for name in ("memory.max", "pids.max", "cpu.max"):
        (tmp_path / "v2" / name).write_text("")

    v1.create()
    v2.create()

    assert (tmp_path / "m/memory.limit_in_bytes").read_text() == str(16 * MIB)
    assert (tmp_path / "p/pids.max").read_text() == "32"
    assert (tmp_path / "c/cpu.cfs_quota_us").read_text() == "1000"
    assert (tmp_path / "v2/memory.max").read_text() == str(16 * MIB)
    assert (tmp_path / "v2/cpu.max").read_text() == "1000 100000"


def test_the_start_up_log_says_whether_proc_hides_other_users() -> None:
    assert "hides" in hidden_processes("proc /proc proc rw,hidepid=invisible 0 0\n")
    assert "hidepid=invisible" in hidden_processes("proc /proc proc rw,relatime 0 0\n")


# --- real groups -------------------------------------------------------------------

HOST, WHY = detect(16) if os.geteuid() == 0 else (None, "the agent is not root")
real = pytest.mark.skipif(HOST is None, reason=f"no per-job cgroups here: {WHY}")


def ensure(job_id: str, command: list[str], **fields: object) -> Ensure:
    body = {"gpus": 0, "name": job_id, "user": "ann", "account": "a", "command": command}
    spec = JobSpec.model_validate({**body, **fields})
    return Ensure(job_id, 1, "node-a", "placed", spec, (), (), None)


class Jobs:
    def __init__(self, root: Path, max_log_bytes: int = 0) -> None:
        self.exits: list[Exited] = []
        self.runner = Runner(
            root, self.exits.append, grace_s=0.5, poll_s=0.02, cgroups=HOST,
            max_log_bytes=max_log_bytes,
        )  # fmt: skip

    def start(self, action: Ensure) -> RunDir:
        assert isinstance(self.runner.ensure(action), Started)
        run = RunDir(self.runner.root, "node-a", *action.key)
        while run.read_pid() is None:
            time.sleep(0.005)
        return run

    async def ended(self, job_id: str, timeout: float = 15.0) -> Exited:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.runner.poll()
            for exited in self.exits:
                if exited.key[0] == job_id:
                    return exited
            await asyncio.sleep(0.02)
        raise AssertionError(f"{job_id} did not end")


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def wait_for_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and path.read_text().endswith("\n"):
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} not written")


@real
@pytest.mark.parametrize("how", ["cancelled", "timed out", "succeeded"])
async def test_a_setsid_child_dies_with_its_job(run_root: Path, how: str) -> None:
    jobs = Jobs(run_root)
    job_id = "sid-" + how.replace(" ", "-")  # a cgroup of its own: none left by another case
    script = "setsid sleep 300 & echo $! > child; " + (
        "exit 0" if how == "succeeded" else "sleep 300"
    )
    run = jobs.start(
        ensure(job_id, ["sh", "-c", script], time_limit_s=3 if how == "timed out" else None)
    )
    child = int(wait_for_file(run.work / "child"))
    assert alive(child)
    group = jobs.runner._procs[(job_id, 1, 0)].cgroup
    assert group is not None and child in group.pids()
    if how == "cancelled":
        jobs.runner.stop((job_id, 1, 0), "cancelled", "by test")

    exited = await jobs.ended(job_id)

    assert exited.ended.outcome == {"cancelled": "cancelled", "timed out": "timed_out"}.get(
        how, "succeeded"
    )
    for _ in range(100):
        if not alive(child):
            break
        time.sleep(0.02)
    assert not alive(child), "the setsid child outlived its job"
    for _ in range(100):
        jobs.runner.poll()
        if not any(path.exists() for path in group.folders):
            break
        time.sleep(0.02)
    assert not any(path.exists() for path in group.folders), "the job's cgroup was left behind"


@real
async def test_a_job_over_its_memory_limit_fails_naming_it(run_root: Path) -> None:
    jobs = Jobs(run_root)
    hog = "import time; x = bytearray(256 << 20); x[::4096] = b'x' * len(x[::4096]); time.sleep(5)"
    jobs.start(ensure("hog", ["python3", "-c", hog], memory_mib=32))

    exited = await jobs.ended("hog")

    assert exited.ended.outcome == "failed"
    assert exited.ended.reason == (
        "killed: memory limit 32 MiB reached (the job asked memory_mib=32)"
    )


@real
async def test_a_fork_bomb_stops_at_pids_max(run_root: Path) -> None:
    jobs = Jobs(run_root)  # pids.max 16 (HOST)
    bomb = "n=0; while [ $n -lt 64 ]; do sleep 30 & n=$((n+1)); done; sleep 1; exit 1"
    jobs.start(ensure("bomb", ["sh", "-c", bomb]))
    group = jobs.runner._procs[("bomb", 1, 0)].cgroup
    assert group is not None
    await asyncio.sleep(0.5)
    assert 0 < len(group.pids()) <= 16

    exited = await jobs.ended("bomb")

    assert exited.ended.outcome == "failed"
    assert "fork(s) refused: pids limit 16 reached" in (exited.ended.reason or "")
    for _ in range(250):  # the killed forks on their way out; then the group goes
        jobs.runner.poll()
        if not any(path.exists() for path in group.folders):
            break
        time.sleep(0.02)
    assert not any(path.exists() for path in group.folders)


@real
async def test_a_job_writing_past_the_log_cap_fails_naming_it(run_root: Path) -> None:
    jobs = Jobs(run_root, max_log_bytes=1 << 20)
    jobs.start(ensure("chatty", ["sh", "-c", "yes 'a line of output'"]))

    exited = await jobs.ended("chatty")

    assert exited.ended.outcome == "failed"
    assert exited.ended.reason == "stdout passed the log cap of 1 MiB (agent_max_log_bytes)"


HIDE, HIDING = process_hiding()


@pytest.mark.skipif(not HIDE, reason=f"no per-job /proc here: {HIDING}")
async def test_a_job_sees_only_its_own_users_processes(run_root: Path) -> None:
    jobs = Jobs(run_root)
    jobs.runner.hide = HIDE
    script = "ls /proc | grep -c '^[0-9]'; cat /proc/1/cmdline || echo no-pid-1"
    jobs.start(ensure("peek", ["sh", "-c", script], user="peeker"))  # no other job is its

    exited = await jobs.ended("peek")

    assert exited.ended.outcome == "succeeded", exited
    count, last = RunDir(jobs.runner.root, "node-a", "peek", 1).file("stdout").read_text().split()
    assert int(count) <= 4 and last == "no-pid-1"  # sh, ls, grep (and the cat)


def test_hiding_other_users_processes_can_be_turned_off() -> None:
    prefix, said = process_hiding("off")
    assert prefix == []
    assert "GPULOOM_AGENT_HIDE_PROCESSES=off" in said or "hides" in said

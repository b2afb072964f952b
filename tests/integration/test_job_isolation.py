"""Jobs of different users are kept apart on a node, and bounded (issue #36, part 4).

Real agents, real processes, real cgroups: each user's jobs run as a uid of their
own, in run folders no other user may enter, with `/proc` showing only their own
processes; every process a job starts (`setsid` too) ends with it; its memory,
processes and logs are bounded, and a job that hits a bound fails saying which.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cluster_fixtures import running_cluster

from gpuloom.testing.cluster import Cluster
from gpuloom.testing.servers import nats_jetstream
from services.agent.cgroups import detect
from services.agent.hiding import process_hiding

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        os.geteuid() != 0, reason="an agent that is not root runs every job as itself"
    ),
]

CGROUPS, NO_CGROUPS = detect()
needs_cgroups = pytest.mark.skipif(CGROUPS is None, reason=f"no per-job cgroups: {NO_CGROUPS}")
HIDE, NO_HIDING = process_hiding()
SECRET = "s3cret-of-alice"


@pytest.fixture(scope="module")
def bounded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A cluster whose agents allow 32 processes and 1 MiB of log per job."""
    base = tmp_path_factory.mktemp("isolation")
    env = {"GPULOOM_AGENT_MAX_PIDS": "32", "GPULOOM_AGENT_MAX_LOG_BYTES": str(1 << 20)}
    with (
        nats_jetstream(base / "nats") as url,
        running_cluster(url, f"sqlite+aiosqlite:///{base}/gpuloom.db", base / "data", env) as c,
    ):
        yield c


def logs(cluster: Cluster, job_id: str) -> dict[str, str]:
    found: dict[str, str] = cluster.http.get(f"/v1/jobs/{job_id}/logs").json()
    return found


def wait_for_line(cluster: Cluster, job_id: str, text: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = logs(cluster, job_id).get("stdout", "")
        if text in out:
            return out
        time.sleep(0.2)
    raise AssertionError(f"{job_id} never printed {text!r}: {logs(cluster, job_id)}")


def test_a_job_of_one_user_cannot_read_another_users_job(bounded: Cluster) -> None:
    cluster = bounded
    alice = cluster.submit(
        user="alice", gpus=0, env={"TEAM_SECRET": SECRET},
        command=["sh", "-c", f"echo {SECRET} > kept; echo $TEAM_SECRET; echo ready; exec sleep 300 {SECRET}"],
    )  # fmt: skip
    wait_for_line(cluster, alice, "ready")
    node = cluster.job(alice)["node"]
    run = f"../../../../{node}/{alice}/1"  # alice's run folder, from bob's work/
    probe = f"""
id -u
for f in /proc/[0-9]*/cmdline /proc/[0-9]*/environ; do cat "$f" 2>/dev/null | tr '\\0' ' '; done
for f in {run}/stdout {run}/work/kept {run}/launch; do cat "$f" 2>/dev/null; done
ls {run} {run}/work ../../.. ../../../.. 2>/dev/null
echo done
"""
    bob = cluster.submit(user="bob", gpus=0, command=["sh", "-c", probe])

    job = cluster.wait_final([bob])[bob]
    assert job["state"] == "succeeded", job
    out = logs(cluster, bob)["stdout"]
    uid = int(out.splitlines()[0])
    assert uid >= 200_000 and out.rstrip().endswith("done"), out
    assert SECRET not in out, f"bob's job read alice's env, argv, files or logs:\n{out}"
    listed = set(out.split())
    assert alice not in listed and not {"stdout", "work", "kept"} & listed, out  # no listing
    assert logs(cluster, alice)["stdout"].startswith(SECRET)  # it was there to read
    if not HIDE:
        pytest.skip(f"argv checked only where /proc hides other users: {NO_HIDING}")
    cluster.http.delete(f"/v1/jobs/{alice}")


@needs_cgroups
@pytest.mark.parametrize("end", ["cancelled", "timed_out"])
def test_a_setsid_child_ends_with_its_job(bounded: Cluster, end: str) -> None:
    cluster = bounded
    script = "setsid sleep 300 & echo child=$!; sleep 300"
    limit = 3 if end == "timed_out" else None
    job_id = cluster.submit(gpus=0, command=["sh", "-c", script], time_limit_s=limit)
    out = wait_for_line(cluster, job_id, "child=")
    child = int(out.split("child=")[1].split()[0])
    assert Path(f"/proc/{child}").exists()
    if end == "cancelled":
        cluster.http.delete(f"/v1/jobs/{job_id}")

    job = cluster.wait_final([job_id], timeout=60)[job_id]

    assert job["state"] == end, job
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}/cmdline").exists() and time.monotonic() < deadline:
        stat = Path(f"/proc/{child}/stat").read_text(errors="replace")
        if stat.rsplit(")", 1)[-1].split()[0] == "Z":
            break
        time.sleep(0.1)
    alive = Path(f"/proc/{child}/stat").exists() and (
        Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[-1].split()[0] != "Z"
    )
    assert not alive, "a setsid child outlived its job"


@needs_cgroups
def test_a_job_over_its_memory_limit_fails_with_the_reason(bounded: Cluster) -> None:
    hog = "x = bytearray(256 << 20); x[::4096] = b'x' * len(x[::4096])"
    job_id = bounded.submit(gpus=0, memory_mib=32, command=["python3", "-c", hog])

    job = bounded.wait_final([job_id], timeout=60)[job_id]

    assert job["state"] == "failed", job
    assert "killed: memory limit 32 MiB reached (the job asked memory_mib=32)" in str(job), job


@needs_cgroups
def test_a_fork_bomb_stops_at_the_pids_limit(bounded: Cluster) -> None:
    bomb = (
        "n=0; while [ $n -lt 200 ]; do sleep 60 & n=$((n+1)); done 2>/dev/null; "
        "echo started=$(jobs -p | wc -l); exit 1"
    )
    job_id = bounded.submit(gpus=0, command=["sh", "-c", bomb])

    job = bounded.wait_final([job_id], timeout=60)[job_id]

    assert job["state"] == "failed", job
    assert "pids limit 32 reached" in str(job), job


def test_a_job_writing_past_the_log_cap_fails_with_the_reason(bounded: Cluster) -> None:
    job_id = bounded.submit(gpus=0, command=["sh", "-c", "yes 'a line of output'"])

    job = bounded.wait_final([job_id], timeout=60)[job_id]

    assert job["state"] == "failed", job
    assert "stdout passed the log cap of 1 MiB (agent_max_log_bytes)" in str(job), job

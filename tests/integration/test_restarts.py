"""Crash safety: kill -9 services while jobs flow; rebuild projections from the log."""

from __future__ import annotations

import signal
import time

import pytest

from gpuloom.store.migrate import downgrade, upgrade
from gpuloom.testing.cluster import Cluster, check_log

pytestmark = pytest.mark.integration


def _submit_burst(cluster: Cluster, count: int, tag: str) -> list[str]:
    return [
        cluster.submit(
            name=f"{tag}-{i}",
            gpus=1 + i % 2,
            account=["research", "prod"][i % 2],
            command=["sh", "-c", "sleep 0.4"],
        )
        for i in range(count)
    ]


def test_kill_9_placement_queue_and_an_agent_while_jobs_flow(cluster: Cluster) -> None:
    stack = cluster.stack
    assert stack is not None
    ids = _submit_burst(cluster, 12, "before")
    for victim in ("placement", "queue", "agent-a"):
        time.sleep(1.0)
        stack.kill(victim, signal.SIGKILL)
        ids += _submit_burst(cluster, 6, f"during-{victim}")
        time.sleep(0.5)
        stack.restart(victim)
    ids += _submit_burst(cluster, 6, "after")
    done = cluster.wait_final(ids, timeout=240)
    assert len(done) == len(ids)
    assert {job["state"] for job in done.values()} <= {"succeeded", "failed"}

    check = check_log(cluster.read_log())
    assert check.overlaps == [], "a GPU ran two jobs at once"
    assert [v for v in check.voided if "held by" in v[1]] == [], "a placement hit a held GPU"
    assert check.max_allocated["node-a"] <= 4 and check.max_allocated["node-b"] <= 2
    for job_id in ids:
        assert check.finals_applied[job_id] == 1, (
            f"job {job_id} ended {check.finals_applied[job_id]} times"
        )
        assert check.state.jobs[job_id].is_final


def test_projections_are_rebuilt_from_the_log(cluster_any_db: Cluster) -> None:
    cluster = cluster_any_db
    import asyncio

    stack = cluster.stack
    assert stack is not None
    ids = _submit_burst(cluster, 8, "rebuild")
    cluster.wait_final(ids, timeout=120)
    deadline = time.monotonic() + 20
    while sum(a["jobs"] for a in cluster.http.get("/v1/usage").json()["accounts"]) < len(ids):
        assert time.monotonic() < deadline, "usage never caught up"
        time.sleep(0.2)
    before = {
        "jobs": cluster.http.get("/v1/jobs", params={"limit": 1000}).json(),
        "nodes": cluster.http.get("/v1/nodes").json(),
        "usage": cluster.http.get("/v1/usage").json(),
    }

    for service in ("gateway", "projector", "accounting"):
        stack.kill(service, signal.SIGTERM)
    asyncio.run(downgrade(cluster.database_url, "base"))  # drop every projection table
    asyncio.run(upgrade(cluster.database_url))
    for service in ("gateway", "projector", "accounting"):
        stack.restart(service)

    deadline = time.monotonic() + 60
    after: dict[str, object] = {}
    while time.monotonic() < deadline:
        try:
            after = {
                "jobs": cluster.http.get("/v1/jobs", params={"limit": 1000}).json(),
                "nodes": cluster.http.get("/v1/nodes").json(),
                "usage": cluster.http.get("/v1/usage").json(),
            }
        except Exception:
            time.sleep(0.3)
            continue
        if after == before:
            break
        time.sleep(0.3)
    assert after == before


def test_a_lost_node_requeues_its_jobs_and_recovers(cluster: Cluster) -> None:
    stack = cluster.stack
    assert stack is not None
    job_id = cluster.submit(gpus=1, gpu_model=["H100-80GB"], command=["sleep", "2"])
    deadline = time.monotonic() + 30
    while cluster.job(job_id)["state"] != "running":
        assert time.monotonic() < deadline, "the job never started"
        time.sleep(0.1)
    stack.kill("agent-b", signal.SIGKILL)
    deadline = time.monotonic() + 30
    while (job := cluster.job(job_id))["state"] != "queued":
        assert time.monotonic() < deadline, f"job not requeued: {job}"
        time.sleep(0.2)
    assert "node-b lost" in job["reason"]
    nodes = {n["name"]: n for n in cluster.http.get("/v1/nodes").json()["nodes"]}
    assert nodes["node-b"]["state"] == "lost"
    assert not any(g["allocated"] for g in nodes["node-b"]["gpus"])

    stack.restart("agent-b")
    done = cluster.wait_final([job_id], timeout=60)[job_id]
    assert done["state"] == "succeeded"
    assert done["attempt"] == 2 and done["node"] == "node-b"
    deadline = time.monotonic() + 20
    while True:
        events = cluster.http.get(f"/v1/jobs/{job_id}/events").json()["events"]
        types = [e["type"] for e in events]
        if types.count("UsageCharged") == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert types.count("JobPlaced") == 2, types
    assert types.count("UsageCharged") == 2, "both runs are charged"

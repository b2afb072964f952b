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


def test_projections_are_rebuilt_from_the_log(cluster: Cluster) -> None:
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

    stack.kill("gateway", signal.SIGTERM)
    stack.kill("accounting", signal.SIGTERM)
    asyncio.run(downgrade(cluster.database_url, "base"))  # drop every projection table
    asyncio.run(upgrade(cluster.database_url))
    stack.restart("gateway")
    stack.restart("accounting")

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

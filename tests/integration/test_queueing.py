"""Backfill, preemption and fair share with the real services.

One simulated node with 4 A100s (one agent) and a queue configured with a fair-share
weight, so that the order between accounts follows their usage. Every test uses its
own accounts; the module ends by auditing the whole log.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gpuloom.events import (
    JobFinished,
    JobPlaced,
    JobPreempted,
    JobReserved,
    JobStarted,
    UsageCharged,
)
from gpuloom.state import fold
from gpuloom.testing.cluster import Cluster, SimNode
from gpuloom.testing.servers import nats_jetstream

NODES = {"agent-q": [SimNode("node-q", "A100-80GB", 4)]}
ENV = {"GPULOOM_PRIORITY_WEIGHT_FAIR_SHARE": "10000", "GPULOOM_CHARGE_INTERVAL_S": "1"}


@pytest.fixture(scope="module")
def queue(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base: Path = tmp_path_factory.mktemp("queueing")
    with nats_jetstream(base / "nats") as url:
        cluster = Cluster(url, f"sqlite+aiosqlite:///{base}/gpuloom.db", base / "data", NODES, ENV)
        try:
            cluster.start()
            cluster.wait_nodes_ready(1)
            yield cluster
            assert cluster.assert_audit_passes().verified > 0
        finally:
            cluster.stop()


def at(job: dict[str, Any], field: str) -> datetime:
    return datetime.fromisoformat(job[field])


def events_of(cluster: Cluster, job_id: str) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = cluster.http.get(f"/v1/jobs/{job_id}/events").json()["events"]
    return events


def test_short_jobs_backfill_around_the_reservation_and_long_ones_wait(queue: Cluster) -> None:
    first = queue.submit(
        gpus=2, account="bf", time_limit_s=12, command=["sleep", "5"], name="first"
    )
    queue.wait_state([first], "running", timeout=30)
    head = queue.submit(gpus=4, account="bf", priority=5000, time_limit_s=30, command=["true"])
    short = queue.submit(gpus=1, account="bf", time_limit_s=4, command=["sleep", "1"])
    endless = queue.submit(gpus=1, account="bf", command=["true"])
    deadline = time.monotonic() + 15
    while (why := queue.http.get(f"/v1/jobs/{endless}/explain").json())["reason"] != "Reservation":
        assert time.monotonic() < deadline, why
        time.sleep(0.2)
    assert head in why["detail"], why
    # explain reads the gateway's fold; GET the row, which the read-model writer writes a
    # moment later (reads wait for the caller's own writes only)
    while not (queue.job(endless)["reason"] or "").startswith("Reservation: it would delay"):
        assert time.monotonic() < deadline, f"GET never says so: {queue.job(endless)}"
        time.sleep(0.1)
    head_view = queue.http.get(f"/v1/jobs/{head}/explain").json()
    assert head_view["reason"] == "Resources" and "reservation" in head_view["detail"]
    assert head_view["estimated_start"] is not None

    done = queue.wait_final([first, head, short, endless], timeout=90)
    assert all(job["state"] == "succeeded" for job in done.values()), done
    assert at(done[short], "started_at") < at(done[head], "started_at"), "short backfilled"
    assert at(done[endless], "started_at") >= at(done[head], "started_at"), "endless waited"
    records = queue.read_log()
    reserved = [r.event for r in records if isinstance(r.event, JobReserved)]
    assert any(e.job_id == head for e in reserved)
    placed = {r.event.job_id: r.event for r in records if isinstance(r.event, JobPlaced)}
    assert placed[short].backfilled and not placed[first].backfilled


def test_a_higher_class_preempts_a_preemptible_job_which_is_requeued(queue: Cluster) -> None:
    victim = queue.submit(
        gpus=4, account="pre", preemptible=True, command=["sleep", "4"], name="victim"
    )
    queue.wait_state([victim], "running", timeout=30)
    urgent = queue.submit(gpus=2, account="pre", priority=10, command=["sleep", "1"])
    done = queue.wait_final([victim, urgent], timeout=90)
    assert done[urgent]["state"] == "succeeded"
    assert done[victim]["state"] == "succeeded" and done[victim]["attempt"] == 2
    assert at(done[victim], "started_at") < at(done[urgent], "started_at")
    types = [e["type"] for e in events_of(queue, victim)]
    assert types.count("JobPlaced") == 2 and "JobPreempted" in types, types
    records = queue.read_log()
    [preempted] = [r.event for r in records if isinstance(r.event, JobPreempted)]
    assert (preempted.job_id, preempted.by, preempted.reason) == (victim, urgent, "priority")
    ends = [
        r.event for r in records if isinstance(r.event, JobFinished) and r.event.job_id == victim
    ]
    assert [e.outcome for e in ends] == ["preempted", "succeeded"]
    deadline = time.monotonic() + 20
    while True:
        charges = [e for e in events_of(queue, victim) if e["type"] == "UsageCharged"]
        finals = sorted(c["data"]["attempt"] for c in charges if c["data"]["period_end"] is None)
        if finals == [1, 2] or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert finals == [1, 2], "the preempted run is charged too: fair share keeps it"


def test_two_accounts_with_equal_shares_converge_to_equal_gpu_time(queue: Cluster) -> None:
    assert queue.http.post("/v1/accounts", json={"name": "fs-org"}).status_code == 201
    for name in ("fs-a", "fs-b"):
        created = queue.http.post("/v1/accounts", json={"name": name, "parent": "fs-org"})
        assert created.status_code == 201, created.text
    # each job takes the whole node, so jobs run one at a time and the order is visible
    burst = 8
    a_jobs = [queue.submit(gpus=4, account="fs-a", command=["sleep", "1"]) for _ in range(burst)]
    b_jobs = [queue.submit(gpus=4, account="fs-b", command=["sleep", "1"]) for _ in range(burst)]
    done = queue.wait_final(a_jobs + b_jobs, timeout=120)
    assert all(job["state"] == "succeeded" for job in done.values())
    records = queue.read_log()
    account = {job_id: "fs-a" for job_id in a_jobs} | {job_id: "fs-b" for job_id in b_jobs}
    starts = [
        r.event.job_id
        for r in records
        if isinstance(r.event, JobStarted) and r.event.job_id in account
    ]
    half = starts[: len(starts) // 2]
    share_a = sum(1 for job_id in half if account[job_id] == "fs-a") / len(half)
    # Without fair share fs-a, which submitted first, would have the whole first half.
    assert abs(share_a - 0.5) <= 0.1, [account[j] for j in starts]
    deadline = time.monotonic() + 20
    while True:  # charges follow the ends
        accounts = queue.http.get("/v1/usage").json()["accounts"]
        usage = {row["account"]: row for row in accounts if row["account"] in ("fs-a", "fs-b")}
        if sum(row["jobs"] for row in usage.values()) == 2 * burst:
            break
        assert time.monotonic() < deadline, usage
        time.sleep(0.2)
    usage = {name: row["gpu_seconds"] for name, row in usage.items()}
    assert abs(usage["fs-a"] - usage["fs-b"]) <= 0.1 * max(usage["fs-a"], usage["fs-b"])


def test_a_running_job_is_charged_periodically_and_the_parts_add_up(queue: Cluster) -> None:
    job_id = queue.submit(gpus=2, account="periodic", command=["sleep", "3.5"])
    queue.wait_state([job_id], "running", timeout=30)
    deadline = time.monotonic() + 10
    while True:  # an interim charge shows while the job still runs
        records = queue.http.get("/v1/usage/jobs", params={"account": "periodic"}).json()
        if records["records"] and queue.job(job_id)["state"] == "running":
            break
        assert time.monotonic() < deadline, records
        time.sleep(0.2)
    queue.wait_final([job_id], timeout=30)
    deadline = time.monotonic() + 20
    while True:
        log = queue.read_log()
        charges = [r.event for r in log if isinstance(r.event, UsageCharged)]
        mine = [c for c in charges if c.job_id == job_id]
        if any(c.period_end is None for c in mine) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [c.part for c in mine] == list(range(len(mine))) and len(mine) >= 2
    assert all(c.period_end is not None for c in mine[:-1]) and mine[-1].period_end is None
    run = fold(log, keep_history=True).jobs[job_id].runs[0]  # charged: kept
    # the parts add up to the run's GPU time (an interim charge that raced the end by a
    # few milliseconds may add that much; the final one then charges nothing)
    assert abs(sum(c.gpu_milli_seconds for c in mine) - run.gpu_milli_seconds()) <= 2000 * 0.05
    charged = sum(c.gpu_milli_seconds for c in mine)
    deadline = time.monotonic() + 10  # the ledger writes the final charge a moment later
    while True:
        [record] = queue.http.get("/v1/usage/jobs", params={"account": "periodic"}).json()[
            "records"
        ]
        if record["gpu_seconds"] * 1000 == pytest.approx(charged):
            break
        assert time.monotonic() < deadline, (record, charged)
        time.sleep(0.2)


def test_a_cordoned_node_takes_no_new_work_until_uncordoned(queue: Cluster) -> None:
    cordoned = queue.http.post("/v1/nodes/node-q/cordon", json={"reason": "maintenance"})
    assert cordoned.status_code == 200 and cordoned.json()["cordoned"] == "maintenance"
    assert queue.http.post("/v1/nodes/nowhere/cordon", json={}).status_code == 404
    job_id = queue.submit(gpus=1, account="cordon", command=["true"])
    deadline = time.monotonic() + 10
    while (why := queue.http.get(f"/v1/jobs/{job_id}/explain").json())["state"] != "queued":
        assert time.monotonic() < deadline, why
        time.sleep(0.2)
    time.sleep(1)  # placement cycles run meanwhile: the job must stay queued
    why = queue.http.get(f"/v1/jobs/{job_id}/explain").json()
    assert why["state"] == "queued" and why["reason"] == "Resources", why
    assert why["nodes"] == {"node-q": "cordoned: maintenance"}
    [node] = queue.http.get("/v1/nodes").json()["nodes"]
    assert node["cordoned"] == "maintenance" and node["state"] == "ready"
    uncordoned = queue.http.delete("/v1/nodes/node-q/cordon")
    assert uncordoned.status_code == 200 and uncordoned.json()["cordoned"] is None
    assert queue.wait_final([job_id], timeout=30)[job_id]["state"] == "succeeded"

"""Submit over REST, admit, queue, place, run on node agents, account — from the log."""

from __future__ import annotations

import time

import pytest

from gpuloom.testing.cluster import Cluster, check_log

pytestmark = pytest.mark.integration


def test_thirty_jobs_oversubscribing_the_cluster_all_finish_and_are_charged(
    cluster: Cluster,
) -> None:
    # 6 GPUs in the cluster; the jobs below need 30 + 6 + 2 + 4 = 42 GPU-slots together
    ids = []
    for i in range(30):
        gpus = [1, 2, 1, 4, 1][i % 5]
        model = ["H100-80GB"] if i % 7 == 0 and gpus <= 2 else []
        ids.append(
            cluster.submit(
                name=f"train-{i}",
                user=["alice", "bob", "carol"][i % 3],
                account=["research", "prod"][i % 2],
                gpus=gpus,
                gpu_model=model,
                priority=i % 3,
                command=["sh", "-c", "echo gpus=$CUDA_VISIBLE_DEVICES; sleep 0.3"],
            )
        )
    done = cluster.wait_final(ids, timeout=180)
    assert {job["state"] for job in done.values()} == {"succeeded"}, done

    records = cluster.read_log()
    check = check_log(records)
    assert check.overlaps == []
    assert [v for v in check.voided if "held by" in v[1]] == []
    assert check.max_allocated["node-a"] <= 4 and check.max_allocated["node-b"] <= 2
    assert check.max_allocated["node-a"] == 4, "the queue should fill node-a"
    for job_id in ids:
        assert check.finals_applied[job_id] == 1
        job = check.state.jobs[job_id]
        if job.spec.gpu_model:
            assert job.node == "node-b"

    # usage per account equals the sum over its jobs of GPUs x run time (within 1 s a job)
    expected: dict[str, float] = {}
    for job_id in ids:
        job = check.state.jobs[job_id]
        for run in job.runs:
            assert run.ended_at is not None
            seconds = (run.ended_at - run.started_at).total_seconds()
            expected[job.spec.account] = expected.get(job.spec.account, 0.0) + run.gpus * seconds
    deadline = time.monotonic() + 20
    while True:
        usage = {u["account"]: u for u in cluster.http.get("/v1/usage").json()["accounts"]}
        if sum(u["jobs"] for u in usage.values()) == len(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.25)
    for account, gpu_seconds in expected.items():
        jobs = sum(1 for j in ids if check.state.jobs[j].spec.account == account)
        assert usage[account]["jobs"] == jobs
        assert abs(usage[account]["gpu_seconds"] - gpu_seconds) <= 1.0 * jobs
        assert usage[account]["gpu_seconds"] > 0


def test_a_job_sees_its_gpus_and_its_logs_are_served(cluster: Cluster) -> None:
    job_id = cluster.submit(
        gpus=2,
        gpu_model=["A100-80GB"],
        env={"GREETING": "hello"},
        command=["sh", "-c", 'echo "$GREETING gpus=$CUDA_VISIBLE_DEVICES"; echo oops >&2; exit 3'],
    )
    job = cluster.wait_final([job_id])[job_id]
    assert job["state"] == "failed"
    assert job["exit_code"] == 3
    assert job["node"] == "node-a" and len(job["gpus"]) == 2
    logs = cluster.http.get(f"/v1/jobs/{job_id}/logs").json()
    assert logs["stdout"].strip() == f"hello gpus={','.join(map(str, job['gpus']))}"
    assert logs["stderr"].strip() == "oops"
    trail = [e["type"] for e in cluster.http.get(f"/v1/jobs/{job_id}/events").json()["events"]]
    assert trail[:6] == [
        "JobSubmitted",
        "JobAdmitted",
        "JobQueued",
        "JobPlaced",
        "JobStarted",
        "JobFinished",
    ]


@pytest.mark.parametrize(
    ("body", "field", "why"),
    [
        ({"gpu_model": ["V100"]}, "gpu_model", "no node has GPU model V100"),
        ({"gpus": 5}, "gpus", "largest node has 4"),
    ],
)
def test_a_job_no_node_could_ever_run_is_refused_at_once(
    cluster: Cluster, body: dict[str, object], field: str, why: str
) -> None:
    job = {"name": "x", "user": "alice", "account": "research", "command": ["true"], "gpus": 1}
    response = cluster.http.post("/v1/jobs", json={**job, **body})
    assert response.status_code == 422, response.text
    [error] = response.json()["errors"]
    assert error["loc"] == ["body", field] and why in error["msg"], error
    assert "no node could ever run this job" in response.json()["detail"]


def test_a_job_the_log_rules_out_is_rejected_with_a_reason(cluster: Cluster) -> None:
    ghost = cluster.submit(command=["true"], depends_on=[{"job": "no-such-job"}])
    done = cluster.wait_final([ghost], timeout=30)
    assert done[ghost]["state"] == "rejected"
    assert "no-such-job" in done[ghost]["reason"]
    # an ended job has left the live state at once (nothing is left to charge): its
    # explanation is how it ended, from its row
    explained = cluster.http.get(f"/v1/jobs/{ghost}/explain").json()
    assert (explained["state"], explained["detail"]) == ("rejected", done[ghost]["reason"])


def test_time_limit_and_cancel(cluster: Cluster) -> None:
    slow = cluster.submit(time_limit_s=1, command=["sleep", "30"])
    running = cluster.submit(command=["sh", "-c", "trap '' TERM; sleep 30"])
    # a third job is cancelled wherever it is by then (queued, placed or running)
    waiting = cluster.submit(gpus=4, gpu_model=["A100-80GB"], priority=-5, command=["sleep", "30"])
    deadline = time.monotonic() + 30
    while cluster.job(running)["state"] != "running" and time.monotonic() < deadline:
        time.sleep(0.1)
    assert cluster.http.delete(f"/v1/jobs/{running}").status_code == 202
    done = cluster.wait_final([slow, running], timeout=60)
    assert done[slow]["state"] == "timed_out"
    assert done[running]["state"] == "cancelled"
    assert cluster.http.delete(f"/v1/jobs/{waiting}").status_code == 202
    assert cluster.wait_final([waiting], timeout=30)[waiting]["state"] == "cancelled"
    again = cluster.http.delete(f"/v1/jobs/{running}")
    assert again.status_code == 409
    assert "already cancelled" in again.json()["detail"]

"""POST /v1/job-batches writes the events single submissions write, checks each job as
POST /v1/jobs does (errors name the job), and a retry with its Idempotency-Key
accepts nothing twice."""

from __future__ import annotations

from typing import Any

from gpuloom.events import JobArraySubmitted, JobSubmitted
from gpuloom.testing.cluster import Cluster

JOBS: list[dict[str, Any]] = [
    {"name": "one", "account": "research", "gpus": 1, "command": ["true"]},
    {"name": "two", "account": "research", "gpus": 2, "command": ["sh", "-c", "exit 0"],
     "env": {"A": "1"}, "time_limit_s": 60, "gpu_model": ["A100-80GB"]},
    {"name": "three", "account": "research", "gpus": 0, "command": ["true"], "array": 3},
    {"name": "four", "user": "bob", "account": "research", "gpus": 1, "command": ["true"],
     "priority": 0},
]  # fmt: skip


def submitted_events(cluster: Cluster, ids: set[str]) -> list[Any]:
    """The submission events of `ids`, in log order, with what tells them apart left out."""
    found = []
    for record in cluster.read_log():
        event = record.event
        if isinstance(event, (JobSubmitted, JobArraySubmitted)) and event.job_id in ids:
            found.append(
                (
                    record.envelope.type,
                    record.envelope.by,
                    record.envelope.principal,
                    event.spec,
                    event.idempotency_key is not None,
                )
            )
    return found


def test_a_batch_writes_what_single_submissions_write(shared_cluster: Cluster) -> None:
    singles = []
    for job in JOBS:
        answer = shared_cluster.http.post("/v1/jobs", json=job)
        assert answer.status_code == 202, answer.text
        singles.append(answer.json())
    answer = shared_cluster.http.post("/v1/job-batches", json={"jobs": JOBS})
    assert answer.status_code == 202, answer.text
    batch = answer.json()["jobs"]
    assert [len(a.get("tasks") or []) for a in batch] == [0, 0, 3, 0]
    assert [len(a.get("tasks") or []) for a in batch] == [
        len(a.get("tasks") or []) for a in singles
    ]
    one_by_one = submitted_events(shared_cluster, {a["id"] for a in singles})
    together = submitted_events(shared_cluster, {a["id"] for a in batch})
    assert together == one_by_one and len(together) == len(JOBS)
    ids = [a["id"] for a in batch]
    ended = shared_cluster.wait_final([ids[0], ids[1], *batch[2]["tasks"], ids[3]], timeout=90)
    assert {job["state"] for job in ended.values()} == {"succeeded"}


def test_an_error_names_the_job_and_nothing_is_written(shared_cluster: Cluster) -> None:
    before = len(shared_cluster.read_log())
    bad = [JOBS[0], {**JOBS[0], "gpus": 99}]
    answer = shared_cluster.http.post("/v1/job-batches", json={"jobs": bad})
    assert answer.status_code == 422, answer.text
    assert answer.json()["errors"][0]["loc"] == ["body", "jobs", 1, "gpus"], answer.text
    reserved = [JOBS[0], JOBS[0], {**JOBS[0], "env": {"CUDA_VISIBLE_DEVICES": "3"}}]
    answer = shared_cluster.http.post("/v1/job-batches", json={"jobs": reserved})
    assert answer.status_code == 422
    assert answer.json()["errors"][0]["loc"] == ["body", "jobs", 2, "env", "CUDA_VISIBLE_DEVICES"]
    alice = shared_cluster.client_for("alice")
    answer = alice.post("/v1/job-batches", json={"jobs": [JOBS[0], {**JOBS[0], "user": "bob"}]})
    assert answer.status_code == 403, answer.text
    assert len(shared_cluster.read_log()) == before
    assert shared_cluster.http.post("/v1/job-batches", json={"jobs": []}).status_code == 422


def test_a_retried_batch_accepts_each_job_once(shared_cluster: Cluster) -> None:
    headers = {"Idempotency-Key": "batch-retry-1"}
    first = shared_cluster.http.post("/v1/job-batches", json={"jobs": JOBS[:2]}, headers=headers)
    again = shared_cluster.http.post("/v1/job-batches", json={"jobs": JOBS[:2]}, headers=headers)
    assert first.status_code == again.status_code == 202, again.text
    ids = [a["id"] for a in first.json()["jobs"]]
    assert [a["id"] for a in again.json()["jobs"]] == ids
    assert len(submitted_events(shared_cluster, set(ids))) == 2

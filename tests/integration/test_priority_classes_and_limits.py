"""Priority classes and per-identity limits against the real stack (issue #10, items 3
and 6): who may ask which priority, which classes preempt, how many jobs one user may
have submitted, and how many GPUs they may hold."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from gpuloom.auth import OPERATOR
from gpuloom.testing.cluster import Cluster

pytestmark = pytest.mark.integration

SLEEP = ["sleep", "300"]


@pytest.fixture
def users(shared_cluster: Cluster) -> Iterator[dict[str, httpx.Client]]:
    clients = {name: shared_cluster.client_for(name) for name in ("alice", "bob", "carl", "dora")}
    clients["ops"] = shared_cluster.client_for("ops", [OPERATOR])
    yield clients
    for client in clients.values():
        client.close()


def submitted(answer: httpx.Response) -> str:
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    return job_id


def spec_of(ops: httpx.Client, job_id: str) -> dict[str, Any]:
    events = ops.get(f"/v1/jobs/{job_id}/events").json()["events"]
    spec: dict[str, Any] = next(e for e in events if e["type"] == "JobSubmitted")["data"]["spec"]
    return spec


def cancel_all(stack: Cluster, job_ids: list[str]) -> None:
    for job_id in job_ids:
        stack.http.delete(f"/v1/jobs/{job_id}")
    stack.wait_final(job_ids, timeout=60)


def test_a_class_bounds_the_priority_its_users_may_ask(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops, alice, bob = users["ops"], users["alice"], users["bob"]
    defined = ops.put(
        "/v1/priority-classes/team", json={"priority": 100, "users": ["alice"], "may_preempt": True}
    )
    assert defined.status_code == 200, defined.text
    listed = alice.get("/v1/priority-classes").json()
    assert {c["name"] for c in listed["classes"]} >= {"team", "normal"}
    assert listed["default"] == "normal"
    job = {"name": "p", "account": "pc", "command": ["true"], "gpus": 0, "priority_class": "team"}

    over = alice.post("/v1/jobs", json={**job, "priority": 500})
    assert over.status_code == 403
    assert over.headers["content-type"].startswith("application/problem+json")
    detail = over.json()["detail"]
    assert "priority 500" in detail and "priority class team" in detail, detail

    by_default = submitted(alice.post("/v1/jobs", json=job))
    lower = submitted(alice.post("/v1/jobs", json={**job, "priority": 50}))
    for_alice = submitted(ops.post("/v1/jobs", json={**job, "user": "alice", "priority": 500}))
    assert (spec_of(ops, by_default)["priority"], spec_of(ops, by_default)["priority_class"]) == (
        100,
        "team",
    ), "no priority asked: the class's"
    assert spec_of(ops, lower)["priority"] == 50
    assert spec_of(ops, for_alice)["priority"] == 500, "an operator may go over the class"
    plain = submitted(alice.post("/v1/jobs", json={**job, "priority_class": None}))
    assert (spec_of(ops, plain)["priority_class"], spec_of(ops, plain)["priority"]) == (
        "normal",
        0,
    )

    not_listed = bob.post("/v1/jobs", json=job)
    assert not_listed.status_code == 403
    assert "may not use priority class team" in not_listed.json()["detail"]
    unknown = alice.post("/v1/jobs", json={**job, "priority_class": "gold"})
    assert unknown.status_code == 403
    assert "priority class gold does not exist" in unknown.text, unknown.text
    assert alice.put("/v1/priority-classes/mine", json={"priority": 1}).status_code == 403
    assert alice.delete("/v1/priority-classes/team").status_code == 403
    shared_cluster.wait_final([by_default, lower, for_alice, plain], timeout=60)


def test_a_class_that_may_not_preempt_does_not(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops = users["ops"]
    for name, may in (("polite", False), ("rude", True)):
        body = {"priority": 1000 if not may else 2000, "may_preempt": may}
        assert ops.put(f"/v1/priority-classes/{name}", json=body).status_code == 200
    whole = {"name": "w", "account": "pc", "command": SLEEP, "gpus": 4, "gpu_model": ["A100-80GB"]}
    victim = submitted(
        ops.post("/v1/jobs", json={**whole, "name": "victim", "user": "bob", "preemptible": True})
    )
    shared_cluster.wait_state([victim], "running", timeout=30)
    polite = submitted(users["alice"].post("/v1/jobs", json={**whole, "priority_class": "polite"}))
    time.sleep(4)  # placement cycles run on every event; a few seconds is many of them
    assert (
        shared_cluster.job(victim)["state"] == "running"
        and shared_cluster.job(victim)["attempt"] == 1
    )
    assert shared_cluster.job(polite)["state"] == "queued"
    victim_events = [e["type"] for e in ops.get(f"/v1/jobs/{victim}/events").json()["events"]]
    assert "JobPreempted" not in victim_events

    # the same cluster, a class that may preempt: it does (so the check above could fail)
    rude = submitted(users["alice"].post("/v1/jobs", json={**whole, "priority_class": "rude"}))
    shared_cluster.wait_state([rude], "running", timeout=60)
    victim_events = [e["type"] for e in ops.get(f"/v1/jobs/{victim}/events").json()["events"]]
    assert "JobPreempted" in victim_events
    cancel_all(shared_cluster, [victim, polite, rude])


def test_submissions_past_max_submit_jobs_are_refused_and_nothing_is_added(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops, carl = users["ops"], users["carl"]
    limited = ops.put("/v1/limits/user/carl", json={"max_submit_jobs": 2, "max_array_size": 4})
    assert limited.status_code == 200, limited.text
    assert {"scope": "user", "name": "carl"}.items() <= limited.json()["limits"][0].items()
    assert carl.put("/v1/limits/user/carl", json={"max_submit_jobs": 99}).status_code == 403
    job = {"name": "c", "account": "lim", "command": SLEEP, "gpus": 0}
    first = submitted(carl.post("/v1/jobs", json=job))
    key = {"Idempotency-Key": "carl-second"}
    second = submitted(carl.post("/v1/jobs", json=job, headers=key))

    third = carl.post("/v1/jobs", json=job)
    assert third.status_code == 403
    assert third.json()["detail"] == (
        "user carl has 2 jobs submitted, the maximum is 2 (max_submit_jobs)"
    )
    big_array = carl.post("/v1/jobs", json={**job, "array": 5})
    assert big_array.status_code == 403
    assert "(max_array_size)" in big_array.json()["detail"]
    assert carl.get("/v1/jobs", params={"user": "carl"}).json()["total"] == 2
    retried = carl.post("/v1/jobs", json=job, headers=key)
    assert submitted(retried) == second, "a retry finds its job, not the limit"

    cancel_all(shared_cluster, [first])  # a final job no longer counts
    third_id = submitted(carl.post("/v1/jobs", json=job))
    cancel_all(shared_cluster, [second, third_id])


def test_a_job_over_max_gpus_waits_with_the_reason(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops, dora = users["ops"], users["dora"]
    assert ops.put("/v1/limits/user/dora", json={"max_gpus": 1}).status_code == 200
    job = {"name": "g", "account": "lim", "command": SLEEP, "gpus": 1}
    holding = submitted(dora.post("/v1/jobs", json=job))
    shared_cluster.wait_state([holding], "running", timeout=30)
    waiting = submitted(dora.post("/v1/jobs", json=job))
    deadline = time.monotonic() + 15
    while not (reason := shared_cluster.job(waiting).get("reason") or "").startswith(
        "AssocGrpGRES"
    ):
        assert time.monotonic() < deadline, shared_cluster.job(waiting)
        time.sleep(0.2)
    assert shared_cluster.job(waiting)["state"] == "queued"
    assert "user dora holds 1 GPUs" in reason and "(max_gpus)" in reason, reason
    explained = dora.get(f"/v1/jobs/{waiting}/explain").json()
    assert explained["reason"] == "AssocGrpGRES"
    assert {row["name"] for row in dora.get("/v1/limits").json()["limits"]} >= {"dora"}

    cancel_all(shared_cluster, [holding])  # GPUs free under the maximum again: it starts
    shared_cluster.wait_state([waiting], "running", timeout=30)
    cancel_all(shared_cluster, [waiting])

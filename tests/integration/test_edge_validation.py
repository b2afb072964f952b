"""Issue #9: no single request can stop the cluster.

Each hostile or careless request of the issue is answered with a clear 4xx naming
what is wrong (or, for a job array, accepted whole), and after all of them the
cluster still places and runs jobs, on SQLite and on PostgreSQL.
"""

from __future__ import annotations

import asyncio
import json
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpuloom.bus import EventBus, Outgoing
from gpuloom.events import (
    JobArraySubmitted,
    JobCancelRequested,
    JobSpec,
    JobSubmitted,
    encode,
    make_envelope,
    subject_for,
)
from gpuloom.state import fold
from gpuloom.testing.cluster import Cluster

pytestmark = pytest.mark.integration

GOOD: dict[str, Any] = {
    "name": "n",
    "user": "u",
    "account": "a",
    "command": ["true"],
    "gpus": 1,
}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({**GOOD, "time_limit_s": 300_000_000_000, "priority": 1000}, "body.time_limit_s"),
        ({**GOOD, "time_limit_s": 2**31}, "body.time_limit_s"),
        ({**GOOD, "time_limit_s": 31 * 24 * 3600}, "body.time_limit_s"),
        ({**GOOD, "env": {"SECRET": "a\u0000b"}}, "body.env.SECRET"),
        ({**GOOD, "command": ["sh", "-c", "echo \u0000"]}, "body.command.2"),
        ({**GOOD, "name": "evil\u0000name"}, "body.name"),
        ({**GOOD, "user": "al\u001bice"}, "body.user"),
        ({**GOOD, "gpu_model": ["X" * 101]}, "body.gpu_model.0"),
        ({**GOOD, "account": "a.b"}, "body.account"),
        ({**GOOD, "memory_mib": 2**31}, "body.memory_mib"),
        ({**GOOD, "depends_on": [{"job": "*"}]}, "body.depends_on.0.job"),
    ],
    ids=[
        "time limit past year 9999",
        "time limit over a 32-bit column",
        "time limit over the cluster's maximum",
        "NUL in an env value",
        "NUL in argv",
        "NUL in the name",
        "escape in the user",
        "GPU model longer than its column",
        "account that is not a subject token",
        "memory over a 32-bit column",
        "dependency on a wildcard",
    ],
)
def test_values_storage_or_exec_cannot_hold_get_422_naming_the_field(
    shared_cluster: Cluster, body: dict[str, Any], field: str
) -> None:
    response = shared_cluster.http.post("/v1/jobs", json=body)
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"]


def test_a_lone_surrogate_gets_422_not_500(shared_cluster: Cluster) -> None:
    raw = b'{"name": "\\ud800", "user": "u", "account": "a", "command": ["true"], "gpus": 1}'
    response = shared_cluster.http.post(
        "/v1/jobs", content=raw, headers={"content-type": "application/json"}
    )
    assert response.status_code == 422, response.text
    assert "body.name" in response.json()["detail"]


def test_an_idempotency_key_that_cannot_be_a_header_gets_422(shared_cluster: Cluster) -> None:
    response = shared_cluster.http.post(
        "/v1/jobs", json=GOOD, headers={"Idempotency-Key": "x" * 201}
    )
    assert response.status_code == 422, response.text
    assert "idempotency-key" in response.json()["detail"].lower()


@pytest.mark.parametrize("job_id", ["*", ">", "a.b", "a%20b"])
def test_ids_that_are_not_subject_tokens_never_reach_a_subject(
    shared_cluster: Cluster, job_id: str
) -> None:
    """`GET /v1/jobs/*/events` once returned every job's events, env values included."""
    secret = shared_cluster.submit(command=["true"], env={"PLANTED": "s3cret"})
    shared_cluster.wait_final([secret])
    for path in (f"/v1/jobs/{job_id}/events", f"/v1/jobs/{job_id}", f"/v1/jobs/{job_id}/logs"):
        response = shared_cluster.http.get(path)
        assert response.status_code in (404, 422), (path, response.text)
        assert "s3cret" not in response.text
    response = shared_cluster.http.post(f"/v1/nodes/{job_id}/cordon", json={})
    assert response.status_code in (404, 422), response.text


def test_an_oversized_body_gets_413_without_retry_after(shared_cluster: Cluster) -> None:
    """A 2.8 MB submission was answered 503 + Retry-After: a client retried it forever."""
    body = {**GOOD, "env": {f"V{i}": "x" * 2800 for i in range(1000)}}
    response = shared_cluster.http.post("/v1/jobs", json=body)
    assert response.status_code == 413, response.text[:300]
    assert "Retry-After" not in response.headers
    assert "at most" in response.json()["detail"]


def test_a_body_under_the_limit_whose_event_is_over_the_bus_limit_gets_413(
    shared_cluster: Cluster,
) -> None:
    """The gateway takes 1 MiB bodies and NATS 1 MiB messages: the envelope around a
    body just under the first is just over the second, and must not look like an outage."""
    limit = 1024 * 1024  # GPULOOM_MAX_BODY_BYTES's default, and NATS's max_payload
    env = {f"PART{i}": "x" * 100_000 for i in range(10)}
    body = {**GOOD, "env": {**env, "BIG": ""}}
    body["env"]["BIG"] = "x" * (limit - 16 - len(json.dumps(body)))
    content = json.dumps(body).encode()
    assert limit - 32 < len(content) <= limit
    response = shared_cluster.http.post(
        "/v1/jobs", content=content, headers={"content-type": "application/json"}
    )
    assert response.status_code == 413, response.text[:300]
    assert "event log takes at most" in response.json()["detail"]
    assert "Retry-After" not in response.headers


def test_an_array_is_one_event_accepted_whole_and_its_id_shows_and_cancels_it(
    shared_cluster: Cluster,
) -> None:
    body = {
        **GOOD,
        "gpus": 0,
        "array": 4,
        "command": ["sleep", "30"],
        "name": "sweep",
    }
    key = "k" * 200  # as long as the column: it once froze the projection on PostgreSQL
    answer = shared_cluster.http.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    assert answer.status_code == 202, answer.text
    array = answer.json()
    assert array["tasks"] == [f"{array['id']}-{i}" for i in range(4)]
    again = shared_cluster.http.post("/v1/jobs", json=body, headers={"Idempotency-Key": key})
    assert again.json() == array, "a retried array makes no new tasks and names the same ones"

    log = shared_cluster.read_log()
    arrays = [r for r in log if isinstance(r.event, JobArraySubmitted)]
    assert [r.event.job_id for r in arrays].count(array["id"]) == 1
    tasks = set(array["tasks"])
    assert not [r for r in log if isinstance(r.event, JobSubmitted) and r.event.job_id in tasks]

    shared_cluster.wait_state(array["tasks"], "running", timeout=30)
    whole = shared_cluster.job(array["id"])
    assert whole["state"] == "running"
    members = whole["array"].pop("members")
    assert whole["array"] == {"tasks": array["tasks"], "states": {"running": 4}}
    assert [(m["id"], m["state"]) for m in members] == [(t, "running") for t in array["tasks"]]
    assert all(m["node"] and m["exit_code"] is None for m in members), members

    cancel = shared_cluster.http.delete(f"/v1/jobs/{array['id']}")
    assert cancel.status_code == 202, cancel.text
    ended = shared_cluster.wait_final(array["tasks"], timeout=30)
    assert {job["state"] for job in ended.values()} == {"cancelled"}
    cancels = [
        r
        for r in shared_cluster.read_log()
        if isinstance(r.event, JobCancelRequested) and r.event.job_id == array["id"]
    ]
    assert len(cancels) == 1, "one event cancels the whole array"
    events = shared_cluster.http.get(f"/v1/jobs/{array['tasks'][2]}/events").json()["events"]
    assert events[0]["type"] == "JobArraySubmitted", "a task's trail starts with its array"
    assert shared_cluster.job(array["id"])["state"] == "cancelled"
    again = shared_cluster.http.delete(f"/v1/jobs/{array['id']}")
    assert again.status_code == 409


def test_after_every_hostile_request_the_cluster_still_runs_jobs_on_each_database(
    cluster_any_db: Cluster,
) -> None:
    """On PostgreSQL these once froze the read model for good (later jobs answered 404)."""
    http = cluster_any_db.http
    hostile: list[tuple[dict[str, Any], dict[str, str]]] = [
        ({**GOOD, "name": "nul\u0000name"}, {}),
        ({**GOOD, "gpu_model": ["M" * 300]}, {}),
        ({**GOOD, "time_limit_s": 2**31}, {}),
        ({**GOOD, "time_limit_s": 300_000_000_000, "priority": 1_000_000}, {}),
        ({**GOOD, "env": {"K": "v\u0000"}}, {}),
        ({**GOOD, "array": 3, "gpus": 0}, {"Idempotency-Key": "i" * 200}),
    ]
    for body, headers in hostile:
        response = http.post("/v1/jobs", json=body, headers=headers)
        assert response.status_code in (202, 422), response.text
    ok = cluster_any_db.submit(command=["true"])
    slow = cluster_any_db.submit(command=["sleep", "30"])
    cluster_any_db.wait_state([slow], "running", timeout=30)
    assert http.delete(f"/v1/jobs/{slow}").status_code == 202
    done = cluster_any_db.wait_final([ok, slow], timeout=30)
    assert done[ok]["state"] == "succeeded"
    assert done[slow]["state"] == "cancelled"
    deadline = time.monotonic() + 10
    while (listed := http.get("/v1/jobs", params={"limit": 5000}).json())["total"] < 5:
        assert time.monotonic() < deadline, listed
        time.sleep(0.2)


def test_an_event_stamped_far_from_when_the_log_stored_it_cannot_move_the_clock(
    shared_cluster: Cluster,
) -> None:
    """A writer's `at` moves the log's clock (ageing, decay, reservations): one stamped
    a year ahead, published straight onto the bus, is kept with its time bounded by the
    log's own timestamp, and dead-lettered as `skew` for an operator to see."""
    forged = JobSubmitted(job_id="from-the-future", spec=JobSpec.model_validate(GOOD))
    envelope = make_envelope(forged, at=datetime.now(UTC) + timedelta(days=365), by="gateway")

    async def put() -> None:
        bus = await EventBus.connect(shared_cluster.nats_url, "GPULOOM", name="forger")
        try:
            await bus.publish(Outgoing(subject_for(forged), encode(envelope), {}))
        finally:
            await bus.close()

    asyncio.run(put())
    ok = shared_cluster.submit(command=["true"])
    assert shared_cluster.wait_final([ok])[ok]["state"] == "succeeded"
    submitted = datetime.fromisoformat(shared_cluster.job("from-the-future")["submitted_at"])
    assert submitted < datetime.now(UTC) + timedelta(minutes=6)
    state = fold(shared_cluster.read_log())
    assert state.skewed >= 1
    assert state.clock is not None and state.clock < datetime.now(UTC) + timedelta(minutes=6)
    deadline = time.monotonic() + 10
    while not any(
        letter.get("reason_kind") == "skew"
        for letter in shared_cluster.http.get("/v1/deadletters").json()["dead_letters"]
    ):
        assert time.monotonic() < deadline, "no skew dead letter"
        time.sleep(0.2)


def test_a_chunked_body_over_the_limit_gets_413_too(shared_cluster: Cluster) -> None:
    """Without Content-Length the body is counted as it streams."""

    def chunks() -> Any:
        yield b'{"name": "n", "user": "u", "account": "a", "gpus": 1, "command": ["'
        for _ in range(40):
            yield b"x" * 65536
        yield b'"]}'

    response = shared_cluster.http.post(
        "/v1/jobs", content=chunks(), headers={"content-type": "application/json"}
    )
    assert response.status_code == 413, response.text[:300]
    assert "at most" in response.json()["detail"]

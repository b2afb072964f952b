"""The REST contract: bad input, idempotency, unknown jobs, NATS outages."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest

from gpuloom.auth import OPERATOR, ensure_secret, issue_token
from gpuloom.devstack import NatsServer, Stack, free_port, migrate, wait_http
from gpuloom.testing.cluster import Cluster, read_log

pytestmark = pytest.mark.integration

GOOD = {"name": "n", "user": "u", "account": "a", "command": ["true"], "gpus": 1}


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({k: v for k, v in GOOD.items() if k != "account"}, "body.account"),
        ({**GOOD, "gpus": -1}, "body.gpus"),
        ({**GOOD, "command": []}, "body.command"),
        ({**GOOD, "command": [""]}, "body.command"),
        ({**GOOD, "time_limit_s": 0}, "body.time_limit_s"),
        ({**GOOD, "surprise": 1}, "body.surprise"),
    ],
    ids=[
        "missing account",
        "negative gpus",
        "empty command",
        "empty program",
        "zero time limit",
        "unknown field",
    ],
)
def test_bad_submissions_get_422_naming_the_field(
    shared_cluster: Cluster, body: dict, field: str
) -> None:
    response = shared_cluster.http.post("/v1/jobs", json=body)
    assert response.status_code == 422
    assert field in response.json()["detail"]


def test_malformed_json_gets_422(shared_cluster: Cluster) -> None:
    response = shared_cluster.http.post(
        "/v1/jobs", content=b"{nope", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert "JSON" in response.json()["detail"]


def test_idempotency_key_returns_the_same_job(shared_cluster: Cluster) -> None:
    http = shared_cluster.http
    before = http.get("/v1/jobs").json()["total"]
    headers = {"Idempotency-Key": "retry-me-1"}
    first = http.post("/v1/jobs", json=GOOD, headers=headers).json()
    second = http.post("/v1/jobs", json=GOOD, headers=headers).json()
    assert first["id"] == second["id"]
    assert http.get("/v1/jobs").json()["total"] == before + 1
    other = http.post("/v1/jobs", json=GOOD, headers={"Idempotency-Key": "another"}).json()
    assert other["id"] != first["id"]


def test_unknown_job_is_404(shared_cluster: Cluster) -> None:
    for path in ("/v1/jobs/nope", "/v1/jobs/nope/events", "/v1/jobs/nope/logs"):
        assert shared_cluster.http.get(path).status_code == 404, path
    assert shared_cluster.http.delete("/v1/jobs/nope").status_code == 404


def test_openapi_and_schemas_are_served(shared_cluster: Cluster) -> None:
    http = shared_cluster.http
    assert "/v1/jobs" in http.get("/openapi.json").json()["paths"]
    assert http.get("/docs").status_code == 200
    schemas = http.get("/v1/schemas/events").json()
    assert schemas["JobPlaced"]["v"] == 1


def test_gateway_answers_503_while_nats_is_down_and_loses_nothing(
    tmp_path: Path, database_url: str
) -> None:
    nats = NatsServer(tmp_path / "nats").start()
    migrate(database_url)
    port = free_port()
    stack = Stack.for_urls(nats.url, database_url, tmp_path, {"GPULOOM_GATEWAY_PORT": str(port)})
    stack.start("gateway")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/healthz")
        secret = ensure_secret(tmp_path / "auth" / "jwt.key")
        token = issue_token(secret, "ops", now=datetime.now(UTC), ttl_s=600, roles=[OPERATOR])
        auth = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=url, timeout=30, headers=auth) as http:
            accepted = [http.post("/v1/jobs", json=GOOD).json()["id"] for _ in range(3)]
            nats.kill()
            time.sleep(0.5)
            down = http.post("/v1/jobs", json=GOOD)
            assert down.status_code == 503
            assert down.headers["Retry-After"]
            assert http.get("/healthz").json()["nats"] is False
            nats = NatsServer(tmp_path / "nats", port=nats.port).start()
            deadline = time.monotonic() + 20
            while (response := http.post("/v1/jobs", json=GOOD)).status_code == 503:
                assert time.monotonic() < deadline, "gateway never reconnected"
                time.sleep(0.3)
            assert response.status_code == 202
            accepted.append(response.json()["id"])
        import asyncio

        logged = {r.event.aggregate_id() for r in asyncio.run(read_log(nats.url))}
        assert set(accepted) <= logged
    finally:
        stack.stop()
        nats.stop()

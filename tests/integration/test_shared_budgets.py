"""What one client or one user may take of what every tenant shares, against a real
stack (issue #36): half-sent requests, event streams, replays and huge submissions are
refused with a reason, and another user is still served at once."""

from __future__ import annotations

import contextlib
import re
import socket
import time
from collections.abc import Iterator

import httpx
import pytest
from cluster_fixtures import running_cluster

from gpuloom.testing.cluster import Cluster
from gpuloom.testing.servers import nats_jetstream

pytestmark = pytest.mark.integration

ENV = {
    "GPULOOM_GATEWAY_MAX_CONNECTIONS": "120",
    "GPULOOM_GATEWAY_MAX_CONNECTIONS_PER_CLIENT": "20",
    "GPULOOM_GATEWAY_HEADER_TIMEOUT_S": "3",
    "GPULOOM_STREAMS_PER_USER": "3",
    "GPULOOM_STREAM_REPLAYS_PER_MINUTE": "2",
    "GPULOOM_STREAM_REPLAY_BEHIND": "0",
}

JOB = {"name": "many", "account": "research", "gpus": 0, "command": ["true"]}


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("guarded")
    with (
        nats_jetstream(base / "nats") as url,
        running_cluster(url, f"sqlite+aiosqlite:///{base}/gpuloom.db", base / "data", ENV) as c,
    ):
        yield c


def half_sent(port: int, source: str) -> socket.socket | None:
    try:
        conn = socket.create_connection(("127.0.0.1", port), timeout=2, source_address=(source, 0))
        conn.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: x\r\n")  # never finished
        return conn
    except OSError:
        return None


def test_half_sent_requests_from_many_addresses_do_not_keep_anyone_out(guarded: Cluster) -> None:
    port = int(guarded.gateway_url.rsplit(":", 1)[1])
    held = [half_sent(port, f"127.0.2.{1 + i // 50}") for i in range(300)]  # 6 addresses
    try:
        started = time.monotonic()
        assert httpx.get(f"{guarded.gateway_url}/healthz", timeout=5).status_code == 200
        with guarded.client_for("alice") as alice:
            assert alice.get("/v1/jobs").status_code == 200
        assert time.monotonic() - started < 2
    finally:
        for conn in held:
            if conn is not None:
                conn.close()


def test_the_connections_of_one_address_past_its_share_get_429(guarded: Cluster) -> None:
    port = int(guarded.gateway_url.rsplit(":", 1)[1])
    held = [half_sent(port, "127.0.3.1") for _ in range(20)]
    try:
        with socket.create_connection(("127.0.0.1", port), 2, ("127.0.3.1", 0)) as extra:
            assert extra.recv(200).startswith(b"HTTP/1.1 429 ")
    finally:
        for conn in held:
            if conn is not None:
                conn.close()


@contextlib.contextmanager
def streams(client: httpx.Client, count: int, **params: int) -> Iterator[list[httpx.Response]]:
    with contextlib.ExitStack() as opened:
        answers = [
            opened.enter_context(client.stream("GET", "/v1/events", params=params))
            for _ in range(count)
        ]
        yield answers


def test_a_users_event_streams_past_the_budget_get_429_and_another_users_do_not(
    guarded: Cluster,
) -> None:
    with guarded.client_for("mallory") as mallory, guarded.client_for("alice") as alice:
        with streams(mallory, 3) as held:
            assert [answer.status_code for answer in held] == [200] * 3
            over = mallory.get("/v1/events")
            assert over.status_code == 429
            assert over.headers["retry-after"] == "5"
            assert "mallory has 3 event streams open" in over.json()["detail"]
            with streams(alice, 1) as hers:
                assert hers[0].status_code == 200
        deadline = time.monotonic() + 10  # closed streams are given back
        while status_of_stream(mallory) == 429:
            assert time.monotonic() < deadline, "mallory's closed streams were not given back"
            time.sleep(0.2)


def status_of_stream(client: httpx.Client) -> int:
    with client.stream("GET", "/v1/events") as answer:
        return answer.status_code


def test_replays_of_the_log_are_budgeted_apart_from_live_streams(guarded: Cluster) -> None:
    guarded.submit(name="r", command=["true"])
    with guarded.client_for("replayer") as client:
        for _ in range(2):
            with streams(client, 1, after=0) as held:
                assert held[0].status_code == 200
        with client.stream("GET", "/v1/events", params={"after": 0}) as over:
            assert over.status_code == 429
            assert 20 <= int(over.headers["retry-after"]) <= 30
            assert "started 2 replays of the log in the last minute" in over.read().decode()
        with streams(client, 1) as live:  # at the log's end: not a replay
            assert live[0].status_code == 200


def test_a_submission_past_the_built_in_limits_is_refused_before_the_log(
    guarded: Cluster,
) -> None:
    with guarded.client_for("alice") as alice:
        assert guarded.client is not None
        operator = guarded.client
        default = {"max_array_size": 100}
        assert operator.put("/v1/limits/default/user", json=default).status_code == 200
        try:
            answer = alice.post("/v1/jobs", json={**JOB, "array": 101})
            assert answer.status_code == 403, answer.text
            assert "(max_array_size, the default for users)" in answer.json()["detail"]
        finally:
            assert operator.put("/v1/limits/default/user", json={}).status_code == 200
        batch = {"jobs": [{**JOB, "array": 6_000}] * 2}
        answer = alice.post("/v1/job-batches", json=batch)
        assert answer.status_code == 403
        assert re.fullmatch(
            r"jobs\[1\]: user alice has 600\d jobs submitted, and this submission adds 6000, "
            r"the maximum is 10000 \(max_submit_jobs, the built-in default for users\)",
            answer.json()["detail"],
        )
        limits = alice.get("/v1/limits").json()
        assert limits["defaults"]["user"]["max_submit_jobs"] == 10_000
        assert limits["defaults"]["cluster"]["max_submit_jobs"] == 100_000

"""GET /v1/events against a real stack: every event exactly once and in order across
reconnects, each user sees only what they may, new events arrive live, bad requests
get 422 before any stream starts."""

from __future__ import annotations

import json
import random
import threading
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gpuloom.client.api import GpuloomClient
from gpuloom.client.cli import app
from gpuloom.client.sse import SseEvent, parse_sse
from gpuloom.client.watch import event_line, follow
from gpuloom.testing.cluster import Cluster

pytestmark = pytest.mark.integration


def read_events(
    client: httpx.Client, count: int, *, after: int | None = None, last_id: str | None = None,
    params: dict[str, Any] | None = None, timeout: float = 10,
    opened: threading.Event | None = None,
) -> list[SseEvent]:  # fmt: skip
    """Open a stream, read `count` events (or until `timeout` passes without a byte:
    under the gateway's 15 s keep-alive), and drop the connection; `opened` is set once
    the stream's start is fixed."""
    headers = {"Last-Event-ID": last_id} if last_id is not None else {}
    query = {**(params or {}), **({"after": after} if after is not None else {})}
    got: list[SseEvent] = []
    with client.stream(
        "GET", "/v1/events", params=query, headers=headers, timeout=httpx.Timeout(timeout)
    ) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        if opened is not None:
            opened.set()
        try:
            for event in parse_sse(response.iter_lines()):
                got.append(event)
                if len(got) >= count:
                    break
        except httpx.ReadTimeout:
            pass
    return got


def seqs_of(events: list[SseEvent]) -> list[int]:
    return [int(e.id) for e in events if e.event == "message" and e.id is not None]


def test_a_client_that_reconnects_anywhere_gets_every_event_once_in_order(
    cluster: Cluster,
) -> None:
    jobs = [cluster.submit(name=f"s-{i}", command=["true"]) for i in range(4)]
    cluster.wait_final(jobs)
    log = [record.seq for record in cluster.read_log()]
    whole = seqs_of(read_events(cluster.http, len(log) + 1, after=0))  # and `open`
    assert whole == log  # the operator sees every event, in the log's order
    for seed in range(4):  # drop the connection after a random number of events each time
        chance = random.Random(seed)
        got: list[int] = []
        last: str | None = "0"
        while len(got) < len(log):
            wanted = min(chance.randint(2, 10), len(log) - len(got) + 1)  # `open` and events
            part = read_events(cluster.http, wanted, last_id=last)
            got += seqs_of(part)
            last = part[-1].id
        assert got == log, seed
    opened, event = read_events(cluster.http, 2, after=0)
    assert (opened.event, opened.id, json.loads(opened.data)) == ("open", "0", {"after": 0})
    first = json.loads(event.data)
    assert first["specversion"] == "1.0" and first["gpuloomseq"] == log[0]
    assert first["type"].startswith("io.gpuloom.") and first["subject"].count("/") == 1


def test_a_users_stream_holds_no_event_of_another_users_job(cluster: Cluster) -> None:
    alices = cluster.submit(name="a", user="alice", command=["true"])
    bobs = cluster.submit(name="b", user="bob", command=["true"])
    cluster.wait_final([alices, bobs])
    total = len(cluster.read_log())
    for user, own, other in (("alice", alices, bobs), ("bob", bobs, alices)):
        with cluster.client_for(user) as client:
            got = read_events(client, total, after=0, timeout=5)
            seen = [json.loads(e.data) for e in got if e.event == "message"]
        subjects = {event["subject"] for event in seen}
        assert f"job/{own}" in subjects and f"job/{other}" not in subjects, user
        assert any(s.startswith("node/") for s in subjects)  # the cluster is for everyone
        mine = {e["type"].split(".")[3] for e in seen if e["subject"] == f"job/{own}"}
        assert {"JobSubmitted", "JobPlaced", "JobFinished"} <= mine, user


def test_a_stream_from_now_gets_new_events_as_they_are_written(cluster: Cluster) -> None:
    got: list[SseEvent] = []
    opened = threading.Event()
    wanted = {"type": ["JobSubmitted", "JobFinished"]}
    reader = threading.Thread(
        target=lambda: got.extend(read_events(cluster.http, 3, params=wanted, opened=opened))
    )
    reader.start()
    assert opened.wait(20), "the stream did not open"
    job = cluster.submit(name="live", command=["true"])
    cluster.wait_final([job])
    reader.join(30)
    assert got[0].event == "open"
    types = [json.loads(e.data)["type"].split(".")[3] for e in got[1:3]]
    assert types == ["JobSubmitted", "JobFinished"]
    assert all(json.loads(e.data)["subject"] == f"job/{job}" for e in got[1:3])


@pytest.mark.parametrize(
    ("params", "headers", "named"),
    [
        ({"type": "NoSuchEvent"}, {}, "query.type"),
        ({"after": -1}, {}, "after"),
        ({"job": "a.b"}, {}, "job"),
        ({}, {"Last-Event-ID": "twelve"}, "last-event-id"),
    ],
)
def test_a_bad_stream_request_gets_422_naming_what_is_wrong(
    shared_cluster: Cluster, params: dict[str, Any], headers: dict[str, str], named: str
) -> None:
    response = shared_cluster.http.get("/v1/events", params=params, headers=headers)
    assert response.status_code == 422, response.text
    assert named in response.text.lower()


def test_submit_wait_and_watch_follow_the_stream(cluster: Cluster) -> None:
    env = {"GPULOOM_TOKEN": cluster.token_for("alice"), "GPULOOM_GATEWAY_URL": cluster.gateway_url}
    runner = CliRunner()
    waited = runner.invoke(
        app, ["submit", "--wait", "--account", "research", "--gpus", "1", "--", "true"], env=env
    )
    assert waited.exit_code == 0, waited.output
    job_id = waited.stdout.strip().splitlines()[0]
    assert f"{job_id}: succeeded" in waited.stderr
    with cluster.client_for("alice") as http:
        gpuloom = GpuloomClient(cluster.gateway_url, token=cluster.token_for("alice"))
        seen = []
        for event in follow(gpuloom, after=0, job=job_id):
            seen.append(event["type"].split(".")[3])
            if seen[-1] == "JobFinished":
                break
        gpuloom.close()
        assert http.get(f"/v1/jobs/{job_id}").json()["state"] == "succeeded"
    assert seen[0] == "JobSubmitted" and "JobStarted" in seen
    assert event_line(event).split()[2] == "JobFinished"

"""A node's bus identity reads its own nodes' jobs and nothing else of the log, against
the real nats-server and services: every way of reading the log is refused to an agent,
the view it may read holds only its nodes' jobs, and a dispatcher killed mid-way
rewrites the view so that a job that ended meanwhile is gone from it."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from typing import Any

import pytest
from nats.js.api import ConsumerConfig, DeliverPolicy
from test_bus_permissions import STREAM, connect_as

from gpuloom.events.subjects import view_consumers
from gpuloom.state.nodeview import KIND_HEADER, decode_record
from gpuloom.testing.cluster import Cluster

pytestmark = pytest.mark.integration

VIEW = f"{STREAM}_VIEW"
SECRET = "s3cret-of-node-b"


def create(stream: str, name: str, filter_subject: str | None = None) -> tuple[str, dict[str, Any]]:
    """The API call that creates consumer `name` of `stream` (filtered: as nats-py
    sends it, the filter in the subject too), and its body."""
    config: dict[str, Any] = {"ack_policy": "none", "deliver_policy": "all", "name": name}
    call = f"$JS.API.CONSUMER.CREATE.{stream}.{name}"
    if filter_subject is not None:
        config["filter_subject"] = filter_subject
        call = f"{call}.{filter_subject}"
    return call, {"stream_name": stream, "config": config}


async def attempt(url: str, identity: str, call: str, body: dict[str, Any]) -> str:
    """Send one JetStream API request as `identity`: its answer, or why none came."""
    errors: list[str] = []
    nc = await connect_as(url, identity, errors)
    try:
        reply = await nc.request(call, json.dumps(body).encode(), timeout=1.0)
        return reply.data.decode()
    except Exception as exc:
        await asyncio.sleep(0.1)
        return f"refused: {type(exc).__name__}; " + "; ".join(errors)
    finally:
        await nc.close()


async def read_view(url: str, identity: str, node: str) -> list[tuple[str, dict[str, str], bytes]]:
    """Every message of `node`'s view, read as `identity` with the consumer an agent makes."""
    nc = await connect_as(url, identity)
    try:
        js = nc.jetstream(timeout=2.0)
        name = view_consumers(node)[1]  # the agent's own is the first
        config = ConsumerConfig(
            name=name,
            filter_subject=f"gpuloom.view.{node}.>",
            deliver_policy=DeliverPolicy.ALL,
            mem_storage=True,
            inactive_threshold=10.0,
        )
        await js.add_consumer(VIEW, config=config)
        sub = await js.pull_subscribe_bind(name, VIEW)
        got = []
        try:
            while True:
                for msg in await sub.fetch(100, timeout=1.0):
                    got.append((msg.subject, dict(msg.headers or {}), msg.data))
        except TimeoutError:
            pass
        return got
    finally:
        await nc.close()


def test_an_agent_reads_its_nodes_view_and_nothing_of_the_log(shared_cluster: Cluster) -> None:
    url = shared_cluster.nats_url
    theirs = shared_cluster.submit(
        gpus=1, gpu_model=["H100-80GB"], command=["sleep", "30"], env={"TOKEN": SECRET}
    )
    mine = shared_cluster.submit(gpus=1, gpu_model=["A100-80GB"], command=["sleep", "30"])
    shared_cluster.wait_state([theirs, mine], "running")
    assert shared_cluster.job(theirs)["node"] == "node-b"
    assert shared_cluster.job(mine)["node"] == "node-a"
    api = "$JS.API"
    refused = {
        "a consumer of the log": create(STREAM, "c1"),
        "a filtered consumer of the log": create(STREAM, "c2", "gpuloom.evt.>"),
        "a direct get of the log": (f"{api}.DIRECT.GET.{STREAM}", {"seq": 1}),
        "a get of the log": (f"{api}.STREAM.MSG.GET.{STREAM}", {"seq": 1}),
        "an unfiltered consumer of the view": create(VIEW, "c3"),
        "a consumer of another node's view": create(VIEW, "c4", "gpuloom.view.node-b.>"),
        "a consumer of its node's view under another name": create(
            VIEW, "c7", "gpuloom.view.node-a.>"
        ),
        "a direct get of the view": (f"{api}.DIRECT.GET.{VIEW}", {"seq": 1}),
    }
    for what, (call, body) in refused.items():
        answer = asyncio.run(attempt(url, "agent-a", call, body))
        assert "permissions violation" in answer.lower(), (what, answer)
    # its own node in the request's subject, another filter in its body: the server refuses
    named = view_consumers("node-a")[1]
    own = f"{api}.CONSUMER.CREATE.{VIEW}.{named}.gpuloom.view.node-a.>"
    _, smuggled = create(VIEW, named, "gpuloom.view.node-b.>")
    assert '"error"' in asyncio.run(attempt(url, "agent-a", own, smuggled))
    _, several = create(VIEW, named)
    several["config"]["filter_subjects"] = ["gpuloom.view.>"]
    assert '"error"' in asyncio.run(attempt(url, "agent-a", own, several))
    # what agent-a may read: its node's jobs, whole, and no other's
    seen = asyncio.run(read_view(url, "agent-a", "node-a"))
    assert seen, "node-a's view is empty"
    assert all(subject.startswith("gpuloom.view.node-a.") for subject, _, _ in seen)
    records = [
        decode_record(data, headers)
        for _, headers, data in seen
        if headers.get(KIND_HEADER) == "record"
    ]
    assert mine in {job.job_id for job in records}
    assert theirs not in {job.job_id for job in records}
    assert not any(SECRET.encode() in data for _, _, data in seen)
    theirs_seen = asyncio.run(read_view(url, "agent-b", "node-b"))
    assert all(subject.startswith("gpuloom.view.node-b.") for subject, _, _ in theirs_seen)
    assert any(SECRET.encode() in data for _, _, data in theirs_seen), "node-b's agent needs it"
    for job in (theirs, mine):
        shared_cluster.http.delete(f"/v1/jobs/{job}").raise_for_status()
    shared_cluster.wait_final([theirs, mine])


def test_a_dispatcher_back_from_a_crash_tombstones_what_ended_meanwhile(
    shared_cluster: Cluster,
) -> None:
    """The job ends while the dispatcher is down (its agent reports the end from the
    record it holds); the dispatcher, back, finds the job's record in the view and
    writes its tombstone, and goes on routing."""
    stack = shared_cluster.stack
    assert stack is not None
    url = shared_cluster.nats_url
    job = shared_cluster.submit(gpus=1, gpu_model=["A100-80GB"], command=["sleep", "2"])
    shared_cluster.wait_state([job], "running")
    stack.kill("dispatch", signal.SIGKILL)
    assert shared_cluster.wait_final([job])[job]["state"] == "succeeded"

    def kinds(of: str) -> list[str]:
        seen = asyncio.run(read_view(url, "agent-a", "node-a"))
        return [h.get(KIND_HEADER, "") for s, h, _ in seen if s.endswith(f".job.{of}")]

    assert kinds(job) == ["record"]  # nobody routed its end
    stack.restart("dispatch")
    deadline = time.monotonic() + 30
    while kinds(job) != ["gone"]:
        assert time.monotonic() < deadline, kinds(job)
        time.sleep(0.3)
    after = shared_cluster.submit(gpus=1, gpu_model=["A100-80GB"], command=["true"])
    assert shared_cluster.wait_final([after])[after]["state"] == "succeeded"

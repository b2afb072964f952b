"""No single message stops the cluster: garbage and a naive-time envelope on the log,
and heartbeats with bad node names, against the real services. Each is dead-lettered
where an operator can list it, and the cluster goes on placing, running and losing."""

from __future__ import annotations

import asyncio
import json
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import nats
import orjson
import pytest
from typer.testing import CliRunner

from gpuloom.auth import OPERATOR
from gpuloom.bus import EventBus, Outgoing
from gpuloom.client.cli import app
from gpuloom.devstack import SERVICES
from gpuloom.events import JobSubmitted, subject_for
from gpuloom.testing.builders import make_job_spec
from gpuloom.testing.cluster import Cluster

pytestmark = pytest.mark.integration

#: Every process that folds the whole log: every service (the reactors, the dispatcher,
#: the gateway's projector, the webhooks process). Agents read their nodes' view, not
#: the log: a bad entry never reaches them.
FOLDERS = set(SERVICES)
GARBAGE = b"\xff\xfe\x00 not an envelope"


async def _publish_bad_entries(url: str) -> tuple[int, int]:
    """Publish garbage bytes and a JobSubmitted whose `at` has no time zone."""
    bus = await EventBus.connect(url, "GPULOOM", name="hostile")
    try:
        event = JobSubmitted(job_id="naive-time", spec=make_job_spec(gpus=0))
        naive = {
            "id": "01HOSTILE0000000000000000",
            "type": "JobSubmitted",
            "v": 1,
            "at": "2026-12-03T10:00:00",
            "by": "gateway",
            "data": event.model_dump(mode="json"),
        }
        garbage_seq, _ = await bus.publish(
            Outgoing("gpuloom.evt.job.garbage.JobSubmitted", GARBAGE, {})
        )
        naive_seq, _ = await bus.publish(Outgoing(subject_for(event), orjson.dumps(naive), {}))
        return garbage_seq, naive_seq
    finally:
        await bus.close()


def _letters(cluster: Cluster) -> dict[str, Any]:
    response = cluster.http.get("/v1/deadletters", params={"limit": 1000})
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def _wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def _by_seq(answer: dict[str, Any], seq: int) -> dict[str, dict[str, Any]]:
    return {d["service"]: d for d in answer["dead_letters"] if d.get("seq") == seq}


def test_bad_entries_on_the_log_stop_no_service_and_are_dead_lettered(cluster: Cluster) -> None:
    stack = cluster.stack
    assert stack is not None
    garbage_seq, naive_seq = asyncio.run(_publish_bad_entries(cluster.nats_url))

    job = cluster.submit(command=["sh", "-c", "echo fine"])
    assert cluster.wait_final([job], timeout=60)[job]["state"] == "succeeded"
    assert stack.exited() == {}, "a service died on a bad entry"

    _wait_for(
        "every folding service's dead letters",
        lambda: (
            set(_by_seq(_letters(cluster), naive_seq)) == FOLDERS
            and set(_by_seq(_letters(cluster), garbage_seq)) == FOLDERS
        ),
    )
    answer = _letters(cluster)
    assert answer["stream"] == "GPULOOM_DLQ" and answer["total"] == 2 * len(FOLDERS)
    garbage = _by_seq(answer, garbage_seq)["queue"]
    assert garbage["reason_kind"] == "malformed" and "not an event envelope" in garbage["reason"]
    assert garbage["excerpt_encoding"] == "base64" and garbage["size"] == len(GARBAGE)
    assert garbage["subject"] == "gpuloom.evt.job.garbage.JobSubmitted"
    naive = _by_seq(answer, naive_seq)["placement"]
    assert naive["reason_kind"] == "malformed" and "timezone" in naive["reason"]
    assert naive["envelope_id"] == "01HOSTILE0000000000000000"
    assert '"at":"2026-12-03T10:00:00"' in naive["excerpt"]
    seqs = [d["dlq_seq"] for d in answer["dead_letters"]]
    assert seqs == sorted(seqs, reverse=True), "newest first"

    metrics = cluster.http.get("/metrics", follow_redirects=True).text
    assert 'gpuloom_dead_letters_total{reason_kind="malformed",service="gateway"} 2.0' in metrics

    as_ops = {"GPULOOM_TOKEN": cluster.token_for("ops", [OPERATOR])}
    cli = CliRunner(env=as_ops).invoke(app, ["--url", cluster.gateway_url, "deadletters", "--json"])
    assert cli.exit_code == 0, cli.output
    assert json.loads(cli.stdout)["total"] == 2 * len(FOLDERS)
    table = CliRunner(env=as_ops).invoke(
        app, ["--url", cluster.gateway_url, "deadletters", "--limit", "3"]
    )
    assert table.exit_code == 0 and "malformed" in table.stdout

    # A restarted service replays the log past both entries without dead-lettering again.
    stack.restart("queue")
    again = cluster.submit(command=["true"])
    assert cluster.wait_final([again], timeout=60)[again]["state"] == "succeeded"
    assert _letters(cluster)["total"] == 2 * len(FOLDERS)
    assert stack.exited() == {}


@contextmanager
def bad_heartbeats(url: str, beats: dict[str, bytes], every_s: float = 0.3) -> Iterator[None]:
    """Publish `beats` (subject -> body) on core NATS, over and over, until the block ends."""
    stop = threading.Event()

    async def publish() -> None:
        nc = await nats.connect(url)
        try:
            while not stop.is_set():
                for subject, body in beats.items():
                    await nc.publish(subject, body)
                await nc.flush()
                await asyncio.sleep(every_s)
        finally:
            await nc.close()

    thread = threading.Thread(target=asyncio.run, args=(publish(),), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(10)


def _heartbeat(node: str) -> bytes:
    spec = {"gpus": [{"index": 0, "uuid": "GPU-x", "model": "A100-80GB", "memory_mib": 1}]}
    return orjson.dumps({"node": node, "spec": spec})


def test_a_bad_heartbeat_does_not_stop_inventory_from_losing_a_silent_node(
    cluster: Cluster,
) -> None:
    stack = cluster.stack
    assert stack is not None
    job = cluster.submit(gpu_model=["H100-80GB"], command=["sh", "-c", "sleep 20"])
    cluster.wait_state([job], "running", timeout=60)
    assert cluster.job(job)["node"] == "node-b"
    beats = {
        "gpuloom.hb.bad": _heartbeat("bad.node"),
        "gpuloom.hb.blank": _heartbeat("x y"),
        "gpuloom.hb.node-q": _heartbeat("node-a"),  # speaking for another node
    }
    with bad_heartbeats(cluster.nats_url, beats):
        time.sleep(1.5)  # inventory has heard them for several rounds
        killed = time.monotonic()
        stack.kill("agent-b", signal.SIGKILL)

        def node_b_lost() -> bool:
            nodes = {n["name"]: n["state"] for n in cluster.http.get("/v1/nodes").json()["nodes"]}
            return nodes.get("node-b") == "lost"

        _wait_for("node-b to be lost", node_b_lost, timeout=20)
        lost_after = time.monotonic() - killed
    assert lost_after < 6 + 4, f"lost after {lost_after:.1f}s; the timeout is 6s"
    requeued = cluster.job(job)
    assert requeued["state"] == "queued" and "node-b lost" in requeued["reason"], requeued
    nodes = {n["name"]: n["state"] for n in cluster.http.get("/v1/nodes").json()["nodes"]}
    assert nodes == {"node-a": "ready", "node-b": "lost"}, "a bad heartbeat registered a node"
    assert stack.exited() == {"agent-b": -signal.SIGKILL}

    refused = [d for d in _letters(cluster)["dead_letters"] if d["reason_kind"] == "heartbeat"]
    assert {d["subject"] for d in refused} == set(beats)
    assert all(d["service"] == "inventory" and d["seq"] is None for d in refused)
    log = (cluster.data_dir / "logs" / "inventory.log").read_text()
    assert log.count("refused heartbeat on 'gpuloom.hb.bad'") == 1, "rate-limited"

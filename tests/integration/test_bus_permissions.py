"""The bus itself enforces who writes what, against the real nats-server and services.

A denied publish is not an error on the publisher: nats-server drops it, the client's
publish times out, and its error callback hears "Permissions Violation". So every
forgery here is checked where it matters, in the stream's contents, with a short
publish timeout.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import nats
import pytest
from nats.js.errors import BadRequestError

from gpuloom.bus import EventBus, Outgoing
from gpuloom.bus.credentials import seed_options
from gpuloom.bus.keyring import Keyring, new_seed, write_private
from gpuloom.bus.reader import read_log
from gpuloom.bus.streams import dead_letter_stream
from gpuloom.devstack import SERVICES  # the processes a cluster runs (not the Kubernetes ones)
from gpuloom.events import (
    JobPlaced,
    JobStarted,
    JobSubmitted,
    PolicyRef,
    WebhookDisabled,
    WebhookRegistered,
    encode,
    make_envelope,
    subject_for,
)
from gpuloom.events.subjects import job_subjects
from gpuloom.natsserver import NatsServer, serving, strip_credentials
from gpuloom.testing.builders import make_job_spec
from gpuloom.testing.cluster import Cluster, check_log

pytestmark = pytest.mark.integration

STREAM = "GPULOOM"


def server_of(url: str) -> NatsServer:
    server = serving(url)
    assert server is not None and server.keyring is not None, "the test NATS runs with auth"
    return server


def body(event: Any) -> bytes:
    return encode(make_envelope(event, at=datetime.now(UTC), by="forger"))


def placed_event(job_id: str) -> JobPlaced:
    return JobPlaced(
        job_id=job_id,
        attempt=1,
        node="node-a",
        gpu_indexes=[0],
        gpu_uuids=["GPU-node-a-0"],
        basis_seq=1,
        cycle_position=0,
        policy=PolicyRef(name="bestfit", version=1),
    )


async def connect_as(url: str, identity: str, errors: list[str] | None = None) -> Any:
    """A raw connection as `identity` (its seed from the test server's keyring)."""
    keyring = server_of(url).keyring
    assert keyring is not None

    async def on_error(exc: Exception) -> None:
        if errors is not None:
            errors.append(str(exc))

    return await nats.connect(
        strip_credentials(url),
        error_cb=on_error,
        allow_reconnect=False,
        max_reconnect_attempts=0,
        connect_timeout=3,
        **seed_options(keyring.seed_file(identity)),
    )


async def try_publish(url: str, identity: str, subject: str, data: bytes, stream: str) -> str:
    """Publish as `identity`; 'stored' or what went wrong (with the error callback's text)."""
    errors: list[str] = []
    nc = await connect_as(url, identity, errors)
    try:
        await nc.jetstream().publish(subject, data, timeout=1.0, stream=stream)
        return "stored"
    except TimeoutError:
        await asyncio.sleep(0.1)
        return "timeout: " + "; ".join(errors)
    finally:
        await nc.close()


async def count_on(url: str, subject: str, stream: str = STREAM) -> int:
    bus = await EventBus.connect(url, stream, name="checker", create=False)
    try:
        info = await bus.js.stream_info(stream, subjects_filter=subject)
        return sum((info.state.subjects or {}).values())
    finally:
        await bus.close()


def wait_for(what: str, check: Callable[[], bool], timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def test_every_process_of_a_cluster_connects_as_its_own_identity(
    shared_cluster: Cluster,
) -> None:
    server = server_of(shared_cluster.nats_url)
    assert server.keyring is not None
    keys = {i.public_key: i.name for i in server.keyring.identities(STREAM)}
    url = f"http://127.0.0.1:{server.monitor_port}/connz?auth=true&limit=1000"
    with urllib.request.urlopen(url, timeout=5) as response:
        connections = json.load(response)["connections"]
    seen = sorted((c.get("name"), keys.get(c.get("authorized_user", ""))) for c in connections)
    expected = [(f"gpuloom-{name}", name) for name in SERVICES]
    expected += [("gpuloom-agent", "agent-a"), ("gpuloom-agent", "agent-b")]
    assert set(expected) <= set(seen), seen
    # nothing of the cluster connects as the admin or without an identity
    assert all(identity not in (None, "admin") for name, identity in seen if name), seen


def test_a_forged_placement_from_the_gateway_or_an_agent_never_reaches_the_log(
    shared_cluster: Cluster,
) -> None:
    url = shared_cluster.nats_url
    placed = placed_event("forged-placement")
    for identity in ("gateway", "agent-a"):
        outcome = asyncio.run(try_publish(url, identity, subject_for(placed), body(placed), STREAM))
        assert outcome.startswith("timeout") and "permissions violation" in outcome.lower(), outcome
    assert asyncio.run(count_on(url, job_subjects("forged-placement"))) == 0


def test_only_the_webhooks_process_disables_a_webhook_and_it_writes_nothing_else(
    shared_cluster: Cluster,
) -> None:
    """Issue #36: webhook delivery runs as its own identity. The gateway may no longer
    write WebhookDisabled; the webhooks identity may, and nothing else."""
    url = shared_cluster.nats_url
    disabled = WebhookDisabled(webhook_id="forged-hook", reason="forged")
    outcome = asyncio.run(
        try_publish(url, "gateway", subject_for(disabled), body(disabled), STREAM)
    )
    assert "permissions violation" in outcome.lower(), outcome
    submitted = JobSubmitted(job_id="from-webhooks", spec=make_job_spec(gpus=1))
    registered = WebhookRegistered(
        webhook_id="forged-hook",
        owner="mallory",
        url="https://example.org/x",
        secret_sealed="v1.x.y",
    )
    placed = placed_event("from-webhooks")
    for event in (submitted, registered, placed):
        outcome = asyncio.run(try_publish(url, "webhooks", subject_for(event), body(event), STREAM))
        assert "permissions violation" in outcome.lower(), (event.TYPE, outcome)
    assert asyncio.run(count_on(url, job_subjects("from-webhooks"))) == 0
    assert asyncio.run(count_on(url, "gpuloom.evt.webhook.forged-hook.>")) == 0
    # its own event passes the server (the fold voids it: no such webhook)
    outcome = asyncio.run(
        try_publish(url, "webhooks", subject_for(disabled), body(disabled), STREAM)
    )
    assert outcome == "stored", outcome
    assert asyncio.run(count_on(url, "gpuloom.evt.webhook.forged-hook.>")) == 1


def test_an_agent_writes_only_for_its_own_nodes_and_the_fold_voids_the_rest(
    shared_cluster: Cluster,
) -> None:
    url = shared_cluster.nats_url
    job = shared_cluster.submit(gpus=1, gpu_model=["H100-80GB"], command=["sleep", "3"])
    shared_cluster.wait_state([job], "running")
    assert shared_cluster.job(job)["node"] == "node-b"
    # agent-a (node-a) speaking for node-b: refused by the server
    as_b = JobStarted(job_id=job, attempt=1, node="node-b", replica=0)
    outcome = asyncio.run(try_publish(url, "agent-a", subject_for(as_b), body(as_b), STREAM))
    assert "permissions violation" in outcome.lower(), outcome
    # nor on the old 5-token subject, which only the admin may still use
    legacy = f"gpuloom.evt.job.{job}.JobStarted"
    outcome = asyncio.run(try_publish(url, "agent-a", legacy, body(as_b), STREAM))
    assert "permissions violation" in outcome.lower(), outcome
    # on its own node's subject it is stored, and the fold voids it
    as_a = JobStarted(job_id=job, attempt=1, node="node-a", replica=0)
    assert asyncio.run(try_publish(url, "agent-a", subject_for(as_a), body(as_a), STREAM)) == (
        "stored"
    )
    records = shared_cluster.read_log()
    [forged] = [r for r in records if r.envelope.by == "forger" and r.event == as_a]
    voided = dict(check_log(records).voided)
    assert "not hosted on node-a" in voided[forged.seq]
    assert shared_cluster.wait_final([job])[job]["state"] == "succeeded"


def test_a_dead_letter_on_another_services_subject_is_refused(shared_cluster: Cluster) -> None:
    url = shared_cluster.nats_url
    dlq = dead_letter_stream(STREAM)
    letter = json.dumps({"service": "placement", "source": "log", "seq": 10**9}).encode()
    outcome = asyncio.run(try_publish(url, "queue", "gpuloom.dlq.placement.log", letter, dlq))
    assert "permissions violation" in outcome.lower(), outcome
    assert asyncio.run(count_on(url, "gpuloom.dlq.placement.log", dlq)) == 0


def test_the_reader_reads_the_log_but_publishes_nothing(shared_cluster: Cluster) -> None:
    url = shared_cluster.nats_url
    keyring = server_of(url).keyring
    assert keyring is not None
    options = seed_options(keyring.seed_file("reader"))
    records = asyncio.run(read_log(strip_credentials(url), options=options))
    assert any(r.event.TYPE == "NodeRegistered" for r in records)
    submitted = JobSubmitted(job_id="from-reader", spec=make_job_spec(gpus=1))
    outcome = asyncio.run(
        try_publish(url, "reader", subject_for(submitted), body(submitted), STREAM)
    )
    assert "permissions violation" in outcome.lower(), outcome
    assert asyncio.run(count_on(url, job_subjects("from-reader"))) == 0


def test_a_body_that_disagrees_with_its_subject_is_dead_lettered_not_applied(
    shared_cluster: Cluster,
) -> None:
    """The gateway may publish on JobSubmitted subjects: a JobPlaced body there passes the
    server, and every reader refuses it as malformed."""
    url = shared_cluster.nats_url
    placed = placed_event("smuggled")
    subject = "gpuloom.evt.job.smuggled.JobSubmitted"
    assert asyncio.run(try_publish(url, "gateway", subject, body(placed), STREAM)) == "stored"
    seq = asyncio.run(_last_seq(url))

    def letters() -> dict[str, dict[str, Any]]:
        answer = shared_cluster.http.get("/v1/deadletters", params={"limit": 1000}).json()
        return {d["service"]: d for d in answer["dead_letters"] if d.get("seq") == seq}

    wait_for("dead letters", lambda: {"placement", "gateway"} <= set(letters()))
    assert "does not match its subject" in letters()["placement"]["reason"]
    assert all(r.seq != seq for r in shared_cluster.read_log())
    assert shared_cluster.http.get("/v1/jobs/smuggled").status_code == 404


async def _last_seq(url: str) -> int:
    bus = await EventBus.connect(url, STREAM, name="checker", create=False)
    try:
        return await bus.last_seq()
    finally:
        await bus.close()


async def _refused(url: str, **options: Any) -> str:
    try:
        nc = await nats.connect(
            url, allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=3, **options
        )
    except Exception as exc:
        return str(exc)
    await nc.close()
    return "connected"


def test_no_credentials_or_a_wrong_seed_cannot_connect(nats_url: str, tmp_path: Path) -> None:
    bare = strip_credentials(nats_url)
    assert "Authorization Violation" in asyncio.run(_refused(bare))
    stranger = tmp_path / "stranger.seed"
    write_private(stranger, new_seed())
    assert "Authorization Violation" in asyncio.run(_refused(bare, **seed_options(stranger)))
    wrong = nats_url.replace("admin:", "admin:x", 1)
    assert "Authorization Violation" in asyncio.run(_refused(wrong))
    assert asyncio.run(_refused(nats_url)) == "connected"


def test_an_agent_added_later_connects_once_the_server_reloads(nats_url: str) -> None:
    server = server_of(nats_url)
    assert asyncio.run(_refused(server.url)) != "connected"
    seed = server.grant_agent("agent-late", ["node-late"])
    assert seed is not None
    assert asyncio.run(_refused(server.url, **seed_options(seed))) == "connected"
    assert isinstance(server.keyring, Keyring) and "agent-late" in server.keyring.agents()


async def test_a_job_subject_with_a_trailing_wildcard_guards_optimistic_writes(
    bus: EventBus,
) -> None:
    """`Nats-Expected-Last-Subject-Sequence-Subject: gpuloom.evt.job.<id>.>` sees the
    agents' 6-token subjects: a write on a stale view of the job is rejected."""
    started = JobStarted(job_id="occ", attempt=1, node="node-a")
    submitted = JobSubmitted(job_id="occ", spec=make_job_spec(gpus=1))
    first, _ = await bus.publish(Outgoing(subject_for(submitted), body(submitted), {}))
    last, _ = await bus.publish(Outgoing(subject_for(started), body(started), {}))
    guard = {"Nats-Expected-Last-Subject-Sequence-Subject": job_subjects("occ")}
    stale = {**guard, "Nats-Expected-Last-Subject-Sequence": str(first)}
    with pytest.raises(BadRequestError) as refused:
        await bus.js.publish(subject_for(submitted), b"{}", headers=stale)
    assert refused.value.err_code == 10071
    fresh = {**guard, "Nats-Expected-Last-Subject-Sequence": str(last)}
    ack = await bus.js.publish(subject_for(submitted), b"{}", headers=fresh)
    assert ack.seq == last + 1

"""Webhooks against a real stack and a real HTTP receiver: signatures checked by this
file's own reading of the Standard Webhooks spec, retries until the receiver answers,
each event delivered once and in log order, a user's webhook gets nothing of another
user's jobs, a 410 disables, a gateway killed mid-way stops nothing, and the webhooks
process killed with deliveries pending (and events written while it is down) loses
none of them."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import signal
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from webhook_helpers import register, wait_until

from gpuloom.devstack import wait_http
from gpuloom.testing.cluster import Cluster
from gpuloom.testing.servers import nats_jetstream

pytestmark = pytest.mark.integration


class Receiver:
    """An HTTP server that records each request and answers from a script
    (`failures` first answers of 500, or always `status`)."""

    def __init__(self, status: int = 200, failures: int = 0) -> None:
        self.status = status
        self.failures = failures
        self.requests: list[tuple[dict[str, str], bytes, int]] = []
        self.lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                with receiver.lock:
                    answer = 500 if receiver.failures > 0 else receiver.status
                    receiver.failures -= 1
                    receiver.requests.append(
                        ({k.lower(): v for k, v in self.headers.items()}, body, answer)
                    )
                self.send_response(answer)
                self.send_header("Content-Length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def delivered(self) -> list[dict[str, Any]]:
        """The CloudEvents answered 2xx, in the order they came."""
        with self.lock:
            return [json.loads(body) for _, body, status in self.requests if status < 300]


def verify(secret: str, headers: dict[str, str], body: bytes) -> bool:
    """The spec, read independently: HMAC-SHA256 over `id.timestamp.body` with the
    base64-decoded key after `whsec_`; any of the space-separated `v1,` signatures."""
    key = base64.b64decode(secret.removeprefix("whsec_"))
    content = f"{headers['webhook-id']}.{headers['webhook-timestamp']}.".encode() + body
    expected = base64.b64encode(hmac.new(key, content, hashlib.sha256).digest()).decode()
    given = [
        s.split(",", 1)[1] for s in headers["webhook-signature"].split() if s.startswith("v1,")
    ]
    return any(hmac.compare_digest(expected, s) for s in given)


def test_deliveries_are_signed_retried_in_order_private_and_survive_a_restart(
    webhook_cluster: Cluster,
) -> None:
    cluster = webhook_cluster
    alice = cluster.client_for("alice")
    bob = cluster.client_for("bob")
    flaky = Receiver(failures=3)
    nosy = Receiver()
    gone = Receiver(status=410)
    mine = register(alice, url=flaky.url, types=["JobSubmitted", "JobStarted", "JobFinished"])
    assert mine["secret"].startswith("whsec_") and mine["owner"] == "alice"
    register(bob, url=nosy.url)
    quitter = register(alice, url=gone.url, types=["JobSubmitted"])

    first = cluster.submit(name="w-1", command=["true"], user="alice")
    cluster.wait_final([first])
    wait_until(lambda: len(flaky.delivered()) == 3)

    # a gateway killed with deliveries still to make stops none of them (the webhooks
    # process delivers, apart from it)
    second = cluster.submit(name="w-2", command=["true"], user="alice")
    assert cluster.stack is not None
    cluster.stack.kill("gateway", signal.SIGKILL)
    cluster.stack.restart("gateway")
    wait_http(f"{cluster.gateway_url}/readyz", timeout=60)
    cluster.wait_final([second])
    wait_until(lambda: len({e["id"] for e in flaky.delivered()}) == 6, timeout=60)

    wanted = [
        r
        for r in cluster.read_log()
        if r.event.TYPE in ("JobSubmitted", "JobStarted", "JobFinished")
        and getattr(r.event, "job_id", None) in (first, second)
    ]
    got = flaky.delivered()
    # at least once: a delivery the killed gateway had made may come again, nothing more
    assert sorted({e["id"] for e in got}) == sorted(r.envelope.id for r in wanted)
    firsts = list(dict.fromkeys(e["gpuloomseq"] for e in got))
    assert firsts == sorted(firsts) == [r.seq for r in wanted]  # in log order
    with flaky.lock:
        requests = list(flaky.requests)
    assert [status for _, _, status in requests[:4]] == [500, 500, 500, 200]
    for headers, body, _ in requests:
        assert verify(mine["secret"], headers, body)
        assert headers["content-type"] == "application/cloudevents+json"
        assert headers["webhook-id"] == json.loads(body)["id"]
        assert not verify(mine["secret"], headers, body + b" ")

    deliveries = alice.get(f"/v1/webhooks/{mine['id']}/deliveries").json()["deliveries"]
    oldest = deliveries[-1]
    assert oldest["status"] == "delivered" and oldest["type"] == "JobSubmitted"
    assert [a["status_code"] for a in oldest["attempts"]] == [500, 500, 500, 200]

    # bob's webhook gets his own job's events, none of alice's (nor webhooks' events)
    bobs = cluster.submit(name="b-1", command=["true"], user="bob")
    cluster.wait_final([bobs])
    wait_until(lambda: any(e["type"].endswith(".JobFinished.v1") for e in nosy.delivered()))
    subjects = {event["subject"] for event in nosy.delivered()}
    assert f"job/{bobs}" in subjects
    assert not any(
        s.startswith("webhook/") or s in (f"job/{first}", f"job/{second}") for s in subjects
    )

    # a 410 disables its webhook; bob may not see or delete alice's
    wait_until(lambda: alice.get(f"/v1/webhooks/{quitter['id']}").json()["disabled"])
    assert len(gone.requests) == 1
    assert bob.get(f"/v1/webhooks/{mine['id']}").status_code == 404
    assert bob.delete(f"/v1/webhooks/{mine['id']}").status_code == 404
    assert [h["id"] for h in bob.get("/v1/webhooks").json()["webhooks"]] != [mine["id"]]
    assert alice.delete(f"/v1/webhooks/{mine['id']}").status_code == 204
    assert alice.get(f"/v1/webhooks/{mine['id']}").status_code == 404


def test_bad_registrations_get_422_naming_the_field(webhook_cluster: Cluster) -> None:
    client = webhook_cluster.http
    for body, field in (
        ({"url": "ftp://example.org/x"}, "url"),
        ({"url": "http://user:pw@example.org/x"}, "url"),
        ({"url": "http://127.0.0.1:9/x", "types": ["NoSuchEvent"]}, "types"),
        ({"url": "http://127.0.0.1:9/x", "secret": "plain"}, "secret"),
        ({"url": "http://127.0.0.1:9/x", "job": "a.>"}, "job"),
    ):
        answer = client.post("/v1/webhooks", json=body)
        assert answer.status_code == 422, (body, answer.text)
        assert field in answer.text, answer.text
    unspecified = client.post("/v1/webhooks", json={"url": "http://0.0.0.0:9/x"})
    assert unspecified.status_code == 403 and "body.url" in unspecified.text
    # a name that does not resolve yet is taken: each attempt will say so
    later = client.post("/v1/webhooks", json={"url": "http://not-yet.invalid/x"})
    assert later.status_code == 201, later.text


def test_the_webhooks_process_killed_with_deliveries_pending_loses_none(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    """kill -9 of the webhooks process while its receiver fails every attempt: the
    pending deliveries are in the database and the events written while it is down are
    held by its durable consumer, so once it is back and the receiver answers, each is
    delivered once, in log order."""
    from cluster_fixtures import running_cluster

    base = tmp_path_factory.mktemp("webhooks-kill")
    # retries for two minutes: nothing is given up while the test looks
    env = {"GPULOOM_WEBHOOK_RETRY_S": json.dumps([0.3] * 400)}
    with (
        nats_jetstream(base / "nats") as url,
        running_cluster(
            url, f"sqlite+aiosqlite:///{base}/gpuloom.db", base / "data", env
        ) as cluster,
    ):
        assert cluster.stack is not None
        alice = cluster.client_for("alice")
        down = Receiver(failures=10**9)  # 500 to everything, until told otherwise
        hook = register(alice, url=down.url, types=["JobSubmitted", "JobFinished"])
        first = cluster.submit(name="k-1", command=["true"], user="alice")
        cluster.wait_final([first])
        wait_until(lambda: len(down.requests) >= 3)  # retried: its deliveries are pending

        cluster.stack.kill("webhooks", signal.SIGKILL)
        second = cluster.submit(name="k-2", command=["true"], user="alice")
        cluster.wait_final([second])  # written to the log while nothing delivers
        with down.lock:
            down.failures = 0
            tried = len(down.requests)
        time.sleep(1.0)
        assert len(down.requests) == tried, "a killed process delivered"
        cluster.stack.restart("webhooks")

        wanted = [
            r
            for r in cluster.read_log()
            if r.event.TYPE in ("JobSubmitted", "JobFinished")
            and getattr(r.event, "job_id", None) in (first, second)
        ]
        wait_until(lambda: len(down.delivered()) >= len(wanted), timeout=90)
        time.sleep(1.0)  # nothing more comes
        got = down.delivered()
        assert [e["id"] for e in got] == [r.envelope.id for r in wanted]  # once, in order
        assert [e["gpuloomseq"] for e in got] == [r.seq for r in wanted]
        deliveries = alice.get(f"/v1/webhooks/{hook['id']}/deliveries").json()["deliveries"]
        assert sorted(d["status"] for d in deliveries) == ["delivered"] * len(wanted)
        oldest = deliveries[-1]
        assert oldest["attempts"][0]["status_code"] == 500  # tried before the kill
        assert oldest["attempts"][-1]["status_code"] == 200

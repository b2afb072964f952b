"""Who may do what, against the real gateway (docs/security.md): every route x every
kind of caller, from one table, the routes enumerated from the app so that a new
route without an entry fails; then the flows the table cannot show (whose name a
job carries, what the log records, what another user sees)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.routing import iter_route_contexts

from gpuloom.auth import OPERATOR, ensure_secret, issue_token
from gpuloom.config import Settings
from gpuloom.testing.cluster import Cluster
from services.gateway.app import create_app

pytestmark = pytest.mark.integration

#: The callers, in the order each route is tried. `owner` submitted the job the job
#: routes act on (account team-a); `coordinator` coordinates team-a, `coordinator
#: of another` team-b; `user` is a plain user of neither.
CALLERS = [
    "no token",
    "expired token",
    "another key",
    "user",
    "coordinator of another",
    "owner",
    "coordinator",
    "operator",
]
UNAUTHENTICATED = {"no token": 401, "expired token": 401, "another key": 401}
OK = "ok"  # authorized: anything but 401 and 403 (202, 404, 409... as the act goes)
PUBLIC = dict.fromkeys(CALLERS, OK)
ANYONE = {**dict.fromkeys(CALLERS, OK), **UNAUTHENTICATED}
JOB_OWNER = {**ANYONE, "user": 403, "coordinator of another": 403}
COORDINATOR = {**JOB_OWNER, "owner": 403}
OPERATOR_ONLY = {**dict.fromkeys(CALLERS, 403), **UNAUTHENTICATED, "operator": OK}

#: Every route of the gateway: what each caller gets, and the request made.
ROUTES: dict[tuple[str, str], tuple[dict[str, Any], dict[str, Any] | None]] = {
    ("POST", "/v1/jobs"): (
        ANYONE,
        {"name": "m", "account": "team-b", "command": ["true"], "gpus": 0},
    ),
    ("POST", "/v1/job-batches"): (
        ANYONE,
        {"jobs": [{"name": "m", "account": "team-b", "command": ["true"], "gpus": 0}]},
    ),
    ("GET", "/v1/jobs"): (ANYONE, None),
    ("GET", "/v1/jobs/{job_id}"): (ANYONE, None),
    ("GET", "/v1/jobs/{job_id}/explain"): (ANYONE, None),
    ("GET", "/v1/jobs/{job_id}/events"): (JOB_OWNER, None),
    ("GET", "/v1/jobs/{job_id}/logs"): (JOB_OWNER, None),
    ("DELETE", "/v1/jobs/{job_id}"): (JOB_OWNER, None),
    ("GET", "/v1/nodes"): (ANYONE, None),
    ("POST", "/v1/nodes/{node}/gpus/{gpu}/pool"): (OPERATOR_ONLY, {"pool": "physical"}),
    # GPU 0 is in service: the operator's call is a 409, not a resume
    ("POST", "/v1/nodes/{node}/gpus/{gpu}/resume"): (OPERATOR_ONLY, {"reason": "matrix"}),
    ("POST", "/v1/nodes/{node}/cordon"): (OPERATOR_ONLY, {"reason": "matrix"}),
    # on a node that does not exist: the operator's call is a 404, not a removal
    ("DELETE", "/v1/nodes/{node}"): (OPERATOR_ONLY, None),
    ("DELETE", "/v1/nodes/{node}/cordon"): (OPERATOR_ONLY, None),
    ("GET", "/v1/queue"): (ANYONE, None),
    ("GET", "/v1/audit"): (ANYONE, None),
    ("GET", "/v1/schemas/events"): (ANYONE, None),
    ("GET", "/v1/events"): (ANYONE, None),
    # anyone registers webhooks; another's is a 404 (`test_webhooks.py` checks that)
    ("POST", "/v1/webhooks"): (ANYONE, {"url": "http://127.0.0.1:9/matrix"}),
    ("GET", "/v1/webhooks"): (ANYONE, None),
    ("GET", "/v1/webhooks/{hook_id}"): (ANYONE, None),
    ("DELETE", "/v1/webhooks/{hook_id}"): (ANYONE, None),
    ("GET", "/v1/webhooks/{hook_id}/deliveries"): (ANYONE, None),
    # the owner with an operator token renews; another's is a 404 (test_webhook_hostile.py)
    ("POST", "/v1/webhooks/{hook_id}/renew"): (ANYONE, None),
    ("GET", "/v1/usage"): (ANYONE, None),
    ("GET", "/v1/usage/jobs"): (ANYONE, None),
    ("GET", "/v1/accounts"): (ANYONE, None),
    ("POST", "/v1/accounts"): (COORDINATOR, {"name": "team-a-new", "parent": "team-a"}),
    ("PUT", "/v1/accounts/{name}/users"): (COORDINATOR, {"users": ["alice", "bob"]}),
    ("PUT", "/v1/accounts/{sub}/shares"): (COORDINATOR, {"shares": 2}),
    ("PUT", "/v1/accounts/{name}/quota"): (OPERATOR_ONLY, {"nominal": None}),
    ("PUT", "/v1/accounts/{name}/coordinators"): (OPERATOR_ONLY, {"coordinators": ["dave"]}),
    ("GET", "/v1/priority-classes"): (ANYONE, None),
    ("PUT", "/v1/priority-classes/{name}"): (OPERATOR_ONLY, {"priority": 5}),
    ("DELETE", "/v1/priority-classes/{name}"): (OPERATOR_ONLY, None),
    ("GET", "/v1/limits"): (ANYONE, None),
    ("GET", "/v1/reservations"): (ANYONE, None),
    ("GET", "/v1/reservations/{name}"): (ANYONE, None),
    # on a node that does not exist: the operator's call is a 422, no reservation is made
    ("POST", "/v1/reservations"): (
        OPERATOR_ONLY,
        {"name": "matrix", "duration_s": 60, "nodes": ["no-such-node"], "users": ["alice"]},
    ),
    ("PATCH", "/v1/reservations/{name}"): (OPERATOR_ONLY, {"description": "matrix"}),
    ("DELETE", "/v1/reservations/{name}"): (OPERATOR_ONLY, None),
    ("PUT", "/v1/limits/{scope}/{name}"): (OPERATOR_ONLY, {"max_gpus": None}),
    ("GET", "/v1/projections"): (OPERATOR_ONLY, None),
    ("GET", "/v1/deadletters"): (OPERATOR_ONLY, None),
    ("GET", "/metrics"): (ANYONE, None),  # a token, unless metrics_public (its own port is open)
    ("GET", "/healthz"): (PUBLIC, None),
    ("GET", "/readyz"): (PUBLIC, None),
    ("GET", "/docs"): (PUBLIC, None),
    ("GET", "/docs/oauth2-redirect"): (PUBLIC, None),
    ("GET", "/redoc"): (PUBLIC, None),
    ("GET", "/openapi.json"): (PUBLIC, None),
    ("GET", "/ui"): (PUBLIC, None),  # the dashboard's static pages (its data calls take a token)
}
#: Path templates whose parameter names differ from the app's (one route, two uses).
ALIASES = {"/v1/accounts/{sub}/shares": "/v1/accounts/{name}/shares"}


def app_routes(tmp_path: Path) -> set[tuple[str, str]]:
    app = create_app(
        Settings(database_url=f"sqlite+aiosqlite:///{tmp_path}/gw.db", data_dir=tmp_path)
    )
    found = set()
    for route in iter_route_contexts(app.routes):
        for method in sorted((route.methods or set()) - {"HEAD"}):
            found.add((method, route.path))
    return found


def test_every_route_of_the_gateway_has_an_entry_in_the_table(tmp_path: Path) -> None:
    listed = {(method, ALIASES.get(path, path)) for method, path in ROUTES}
    assert app_routes(tmp_path) == listed


@pytest.fixture(scope="module")
def world(shared_cluster: Cluster) -> Iterator[dict[str, Any]]:
    """Accounts org > team-a (members alice, bob; coordinator dave) > team-a-1, and
    org > team-b (coordinator erin); a running job of alice's under team-a."""
    ops = shared_cluster.http
    for body in (
        {"name": "org"},
        {"name": "team-a", "parent": "org"},
        {"name": "team-a-1", "parent": "team-a"},
        {"name": "team-b", "parent": "org"},
    ):
        assert ops.post("/v1/accounts", json=body).status_code == 201
    assert ops.put("/v1/accounts/team-a/users", json={"users": ["alice", "bob"]}).is_success
    for account, coordinator in (("team-a", "dave"), ("team-b", "erin")):
        answer = ops.put(
            f"/v1/accounts/{account}/coordinators", json={"coordinators": [coordinator]}
        )
        assert answer.status_code == 200 and answer.json()["coordinators"] == [coordinator]
    clients = {
        "user": shared_cluster.client_for("mallory"),
        "coordinator of another": shared_cluster.client_for("erin"),
        "owner": shared_cluster.client_for("alice"),
        "coordinator": shared_cluster.client_for("dave"),
        "operator": shared_cluster.client_for("ops", [OPERATOR]),
    }
    job = {"name": "long", "account": "team-a", "command": ["sleep", "300"], "gpus": 0}
    submitted = clients["owner"].post("/v1/jobs", json=job)
    assert submitted.status_code == 202, submitted.text
    job_id = submitted.json()["id"]
    shared_cluster.wait_state([job_id], "running")
    secret = ensure_secret(shared_cluster.data_dir / "auth" / "jwt.key")
    long_ago = datetime.now(UTC) - timedelta(hours=3)
    bad_tokens = {
        "no token": None,
        "expired token": issue_token(secret, "ops", now=long_ago, ttl_s=600, roles=[OPERATOR]),
        "another key": issue_token(b"k" * 43, "ops", now=datetime.now(UTC), ttl_s=600),
    }
    for caller, token in bad_tokens.items():
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        clients[caller] = httpx.Client(
            base_url=shared_cluster.gateway_url, timeout=30, headers=headers
        )
    yield {"clients": clients, "job_id": job_id, "cluster": shared_cluster}
    for client in clients.values():
        client.close()


@pytest.mark.parametrize(("method", "template"), list(ROUTES), ids=[f"{m} {p}" for m, p in ROUTES])
def test_who_gets_what_on_each_route(world: dict[str, Any], method: str, template: str) -> None:
    expected, body = ROUTES[(method, template)]
    node = "no-such-node" if (method, template) == ("DELETE", "/v1/nodes/{node}") else "node-a"
    path = template.format(
        job_id=world["job_id"], node=node, gpu=0, name="team-a", sub="team-a-1",
        scope="account", hook_id="no-such-hook",
    )  # fmt: skip
    got: dict[str, Any] = {}
    for caller in CALLERS:  # streamed: the event stream answers, then never ends
        with world["clients"][caller].stream(method, path, json=body) as answer:
            got[caller] = answer.status_code if answer.status_code in (401, 403) else OK
            if answer.status_code == 401:
                assert answer.headers["www-authenticate"].startswith('Bearer realm="gpuloom"')
            if answer.status_code in (401, 403):
                answer.read()
                assert answer.json()["detail"], answer.text
    assert got == expected


def test_the_job_carries_the_tokens_user_whatever_the_body_says(world: dict[str, Any]) -> None:
    cluster: Cluster = world["cluster"]
    alice, ops = world["clients"]["owner"], world["clients"]["operator"]
    job = {"name": "t", "account": "team-a", "command": ["true"], "gpus": 1}
    forged = alice.post("/v1/jobs", json={**job, "user": "bob"})
    assert forged.status_code == 403
    assert forged.json()["detail"] == (
        "alice may not submit as bob: only an operator may submit for another user"
    )
    outsider = world["clients"]["user"].post("/v1/jobs", json=job)
    assert outsider.status_code == 403
    assert outsider.json()["detail"] == "user mallory may not submit under account team-a"

    own = alice.post("/v1/jobs", json=job).json()["id"]
    for_bob = ops.post("/v1/jobs", json={**job, "user": "bob"}).json()["id"]
    done = cluster.wait_final([own, for_bob], timeout=60)
    assert (done[own]["user"], done[for_bob]["user"]) == ("alice", "bob")
    assert done[for_bob]["state"] == "succeeded"

    events = ops.get(f"/v1/jobs/{for_bob}/events").json()["events"]
    submitted = next(e for e in events if e["type"] == "JobSubmitted")
    assert submitted["data"]["spec"]["user"] == "bob" and submitted["principal"] == "ops"
    assert {e["principal"] for e in events if e["by"] != "gateway"} == {None}
    own_events = alice.get(f"/v1/jobs/{own}/events").json()["events"]
    assert own_events[0]["principal"] == "alice"

    # GPU time is charged to bob, and only those who may see bob's usage see it
    deadline = time.monotonic() + 30
    while not (_charged(ops, for_bob) and _charged(ops, own)):
        assert time.monotonic() < deadline, "the runs were never charged"
        time.sleep(0.3)
    record = next(r for r in _records(ops) if r["job_id"] == for_bob)
    assert (record["user"], record["account"]) == ("bob", "team-a")
    assert _charged(world["clients"]["coordinator"], for_bob)  # dave coordinates team-a
    assert not _charged(world["clients"]["coordinator of another"], for_bob)
    assert not _charged(alice, for_bob) and _charged(alice, own)
    users = {row["user"] for row in alice.get("/v1/usage").json()["users"]}
    assert users == {"alice"}


def _records(client: httpx.Client) -> list[dict[str, Any]]:
    answer = client.get("/v1/usage/jobs")
    assert answer.status_code == 200, answer.text
    records: list[dict[str, Any]] = answer.json()["records"]
    return records


def _charged(client: httpx.Client, job_id: str) -> bool:
    return any(r["job_id"] == job_id for r in _records(client))


def test_a_user_cannot_cancel_another_users_job_nor_read_it(world: dict[str, Any]) -> None:
    cluster: Cluster = world["cluster"]
    alice, mallory = world["clients"]["owner"], world["clients"]["user"]
    job = {"name": "secret", "account": "team-a", "command": ["sleep", "300"], "gpus": 0}
    job_id = alice.post("/v1/jobs", json={**job, "env": {"TOKEN": "hunter2"}}).json()["id"]
    cluster.wait_state([job_id], "running")
    for method, path in (
        ("DELETE", f"/v1/jobs/{job_id}"),
        ("GET", f"/v1/jobs/{job_id}/logs"),
        ("GET", f"/v1/jobs/{job_id}/events"),
    ):
        answer = mallory.request(method, path)
        assert answer.status_code == 403, (method, path, answer.text)
        assert "only its user, a coordinator of account team-a or an operator" in answer.text
    seen = mallory.get(f"/v1/jobs/{job_id}").json()
    assert seen["user"] == "alice" and seen["command"] is None  # the rest is public
    listed = {j["id"]: j for j in mallory.get("/v1/jobs", params={"limit": 5000}).json()["jobs"]}
    assert listed[job_id]["command"] is None
    assert "hunter2" not in mallory.get("/v1/jobs", params={"limit": 5000}).text
    assert alice.get(f"/v1/jobs/{job_id}").json()["command"] == ["sleep", "300"]
    assert world["clients"]["coordinator"].get(f"/v1/jobs/{job_id}").json()["command"]
    assert cluster.job(job_id)["state"] == "running"  # mallory's cancel did nothing

    cancel = world["clients"]["coordinator"].delete(f"/v1/jobs/{job_id}")
    assert cancel.status_code == 202
    assert cluster.wait_final([job_id], timeout=60)[job_id]["state"] == "cancelled"
    events = alice.get(f"/v1/jobs/{job_id}/events").json()["events"]
    request = next(e for e in events if e["type"] == "JobCancelRequested")
    assert request["principal"] == "dave" and request["data"]["requested_by"] == "dave"


def test_coordinators_manage_their_subtree_only(world: dict[str, Any]) -> None:
    dave, erin = world["clients"]["coordinator"], world["clients"]["coordinator of another"]
    made = dave.post("/v1/accounts", json={"name": "team-a-2", "parent": "team-a-1", "shares": 3})
    assert made.status_code == 201 and made.json()["shares"] == 3
    assert dave.put("/v1/accounts/team-a-2/users", json={"users": ["carl"]}).status_code == 200
    assert erin.put("/v1/accounts/team-a-2/users", json={"users": ["erin"]}).status_code == 403
    assert dave.put("/v1/accounts/team-a/shares", json={"shares": 100}).status_code == 403
    assert dave.put("/v1/accounts/team-b/users", json={"users": ["dave"]}).status_code == 403
    refused = dave.post("/v1/accounts", json={"name": "mine"})
    assert refused.status_code == 403
    assert refused.json() == {
        "type": "about:blank",
        "title": "Forbidden",
        "status": 403,
        "detail": "dave may not create a top-level account: it needs the operator role",
    }

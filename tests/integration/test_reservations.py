"""Advance reservations against the real stack (issue #38, item 4; docs/reservations.md):
operators make, list, show, change and delete them over REST and with the CLI; what is
refused names its field; a reservation keeps other jobs without a time limit off its
GPUs while short ones backfill; its own jobs wait for its start, then run on its GPUs; a
maintenance window is ReqNodeNotAvail; running jobs that would still hold its GPUs are
named; deleting one cancels its waiting jobs. The last test runs `gpuloom audit`.

node-a has 4 A100-80GB (rack r1), node-b 2 H100-80GB (rack r2)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from gpuloom.auth import OPERATOR
from gpuloom.client.cli import app
from gpuloom.testing.cluster import Cluster

pytestmark = pytest.mark.integration

SLEEP = ["sleep", "300"]
H100 = {"gpus": 2, "gpu_model": ["H100-80GB"]}


@pytest.fixture
def users(shared_cluster: Cluster) -> Iterator[dict[str, httpx.Client]]:
    clients = {name: shared_cluster.client_for(name) for name in ("alice", "bob", "carl")}
    clients["ops"] = shared_cluster.client_for("ops", [OPERATOR])
    yield clients
    for client in clients.values():
        client.close()


def iso(moment: datetime) -> str:
    return moment.isoformat()


def in_(seconds: float) -> datetime:
    return datetime.now(UTC) + timedelta(seconds=seconds)


def made(answer: httpx.Response) -> dict[str, Any]:
    assert answer.status_code == 201, answer.text
    doc: dict[str, Any] = answer.json()
    return doc


def submitted(client: httpx.Client, **job: Any) -> str:
    body = {"name": "r", "command": SLEEP, **job}
    answer = client.post("/v1/jobs", json=body)
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    return job_id


def field_of(answer: httpx.Response) -> list[Any]:
    """The `loc` of the one field a 422 names."""
    assert answer.status_code == 422, answer.text
    [error] = answer.json()["errors"]
    loc: list[Any] = error["loc"]
    return loc


def wait_reason(cluster: Cluster, job_id: str, code: str, timeout: float = 20) -> str:
    """The job's pending reason once it starts with `code` (it is still queued)."""
    deadline = time.monotonic() + timeout
    while not (reason := str((job := cluster.job(job_id)).get("reason"))).startswith(code):
        assert time.monotonic() < deadline, {k: job.get(k) for k in ("state", "reason")}
        time.sleep(0.2)
    assert job["state"] == "queued", job
    return reason


def cancel_all(cluster: Cluster, job_ids: list[str]) -> None:
    for job_id in job_ids:
        cluster.http.delete(f"/v1/jobs/{job_id}")
    cluster.wait_final(job_ids, timeout=60)


def gpuloom(cluster: Cluster, *args: str, user: str = "ops") -> tuple[int, str, str]:
    roles = [OPERATOR] if user == "ops" else []
    env = {
        "GPULOOM_TOKEN": cluster.token_for(user, roles),
        "GPULOOM_GATEWAY_URL": cluster.gateway_url,
    }
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_operators_make_list_show_change_and_delete_reservations(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops, alice = users["ops"], users["alice"]
    start = in_(3600).replace(microsecond=0)
    day = made(
        ops.post(
            "/v1/reservations",
            json={
                "name": "day", "start": iso(start), "duration_s": 3600,
                "gpus": {"count": 2, "gpu_model": ["H100-80GB"]}, "accounts": ["acct-a"],
                "description": "the day's run",
            },
        )
    )  # fmt: skip
    assert day["gpus"] == [{"node": "node-b", "index": 0}, {"node": "node-b", "index": 1}]
    assert (day["nodes"], day["accounts"], day["flags"]) == (["node-b"], ["acct-a"], [])
    assert (day["state"], day["started"], day["description"]) == ("pending", False, "the day's run")
    assert datetime.fromisoformat(day["end"]) == start + timedelta(hours=1)

    listed = alice.get("/v1/reservations")
    assert listed.status_code == 200 and [r["name"] for r in listed.json()["reservations"]] == [
        "day"
    ], "any user reads them"
    assert alice.get("/v1/reservations/day").json() == day
    assert alice.get("/v1/reservations/none").status_code == 404
    changed = ops.patch("/v1/reservations/day", json={"users": ["alice"], "duration_s": 7200})
    assert changed.status_code == 200, changed.text
    assert (changed.json()["users"], changed.json()["accounts"]) == (["alice"], ["acct-a"])
    assert datetime.fromisoformat(changed.json()["end"]) == start + timedelta(hours=2)
    assert changed.json()["gpus"] == day["gpus"], "no nodes nor gpus given: the same GPUs"

    code, out, err = gpuloom(
        shared_cluster, "reservation", "create", "cli", "--start", "now+2h", "--duration", "30m",
        "--nodes", "node-a", "--users", "bob", "--json",
    )  # fmt: skip
    assert code == 0, err
    cli = json.loads(out)
    assert (cli["nodes"], len(cli["gpus"]), cli["users"]) == (["node-a"], 4, ["bob"])
    code, out, err = gpuloom(shared_cluster, "reservation", "list", user="carl")
    assert code == 0 and "day" in out and "cli" in out and "pending" in out, err
    code, out, err = gpuloom(
        shared_cluster, "reservation", "update", "cli", "--start", "now+3h", "--description",
        "moved", "--json",
    )  # fmt: skip
    assert code == 0, err
    moved = json.loads(out)
    assert moved["description"] == "moved"
    new_start, new_end = (datetime.fromisoformat(moved[k]) for k in ("start", "end"))
    assert new_end - new_start == timedelta(minutes=30), "a new start keeps the duration"
    assert new_start > datetime.fromisoformat(cli["start"]) + timedelta(minutes=59)
    code, out, err = gpuloom(shared_cluster, "reservation", "show", "cli")
    assert code == 0 and "moved" in out and "node-a/3" in out, err
    code, out, err = gpuloom(shared_cluster, "reservation", "delete", "cli")
    assert code == 0 and "deleted" in out, err
    assert alice.get("/v1/reservations/cli").status_code == 404

    assert ops.delete("/v1/reservations/day").status_code == 204
    assert ops.delete("/v1/reservations/day").status_code == 404
    assert alice.get("/v1/reservations").json() == {"reservations": []}


def test_what_is_refused_names_its_field_or_says_why(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops, bob, carl = users["ops"], users["bob"], users["carl"]
    base = {
        "name": "bad", "start": iso(in_(3600)), "duration_s": 600, "nodes": ["node-a"],
        "users": ["alice"],
    }  # fmt: skip

    def post(**change: Any) -> httpx.Response:
        body = {k: v for k, v in {**base, **change}.items() if v is not None}
        return ops.post("/v1/reservations", json=body)

    level = post(nodes=None, gpus={"count": 1, "topology_level": "row"})
    assert field_of(level) == ["body", "gpus", "topology_level"]
    assert "levels in the cluster: block, nvlink, rack" in level.text, level.text
    assert field_of(post(duration_s=None, end=iso(in_(1800)))) == ["body", "end"]
    assert field_of(post(end=iso(in_(7200)))) == ["body", "duration_s"]
    assert field_of(post(nodes=["node-z"])) == ["body", "nodes", 0]
    assert field_of(post(nodes=None)) == ["body", "nodes"]

    made(post(name="dup"))
    again = post(name="dup")
    assert again.status_code == 409 and "reservation dup exists" in again.json()["detail"]
    assert carl.post("/v1/reservations", json={**base, "name": "mine"}).status_code == 403
    assert carl.patch("/v1/reservations/dup", json={"description": "x"}).status_code == 403
    assert carl.delete("/v1/reservations/dup").status_code == 403
    code, _, err = gpuloom(shared_cluster, "reservation", "delete", "dup", user="carl")
    assert code == 1 and "operator" in err, err

    outsider = bob.post(
        "/v1/jobs",
        json={"name": "r", "account": "acct-b", "command": SLEEP, "gpus": 1, "reservation": "dup"},
    )
    assert field_of(outsider) == ["body", "reservation"]
    assert "does not let user bob or account acct-b in" in outsider.text, outsider.text
    code, _, err = gpuloom(
        shared_cluster, "submit", "--account", "acct-b", "--reservation", "nowhere", "--", "true",
        user="bob",
    )  # fmt: skip
    assert code == 1 and "reservation nowhere does not exist" in err, err
    assert ops.delete("/v1/reservations/dup").status_code == 204


def test_other_jobs_without_a_time_limit_keep_off_while_short_ones_backfill(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops, bob = users["ops"], users["bob"]
    made(
        ops.post(
            "/v1/reservations",
            json={"name": "for-a", "start": iso(in_(3600)), "duration_s": 3600,
                  "nodes": ["node-b"], "accounts": ["acct-a"]},
        )
    )  # fmt: skip
    forever = submitted(bob, account="acct-b", **H100)
    reason = wait_reason(shared_cluster, forever, "Reservation")
    assert "for-a" in reason, reason
    assert bob.get(f"/v1/jobs/{forever}/explain").json()["reason"] == "Reservation"
    short = submitted(bob, account="acct-b", time_limit_s=60, command=["sleep", "1"], **H100)
    done = shared_cluster.wait_final([short], timeout=60)[short]
    assert (done["state"], done["node"]) == ("succeeded", "node-b"), "it ends before the start"
    assert shared_cluster.job(forever)["state"] == "queued"
    cancel_all(shared_cluster, [forever])
    assert ops.delete("/v1/reservations/for-a").status_code == 204


def test_a_job_of_the_reservation_waits_for_its_start_then_runs_on_its_gpus(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops, alice = users["ops"], users["alice"]
    start = in_(8)
    soon = made(
        ops.post(
            "/v1/reservations",
            json={"name": "soon", "start": iso(start), "duration_s": 600,
                  "gpus": {"count": 1, "gpu_model": ["A100-80GB"]}, "accounts": ["acct-a"]},
        )
    )  # fmt: skip
    [gpu] = soon["gpus"]
    mine = submitted(alice, account="acct-a", gpus=1, reservation="soon")
    reason = wait_reason(shared_cluster, mine, "Reservation", timeout=6)
    assert "waiting for reservation soon to start" in reason, reason
    shared_cluster.wait_state([mine], "running", timeout=30)
    job = shared_cluster.job(mine)
    assert (job["node"], job["gpus"]) == (gpu["node"], [gpu["index"]])
    assert job["request"]["reservation"] == "soon", job["request"]
    assert datetime.fromisoformat(job["started_at"]) >= start
    assert ops.get("/v1/reservations/soon").json()["state"] == "active"
    cancel_all(shared_cluster, [mine])
    assert ops.delete("/v1/reservations/soon").status_code == 204


def test_a_maintenance_window_keeps_jobs_without_a_limit_off_its_nodes(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops, alice, bob = users["ops"], users["alice"], users["bob"]
    made(
        ops.post(
            "/v1/reservations",
            json={"name": "fix", "start": iso(in_(600)), "duration_s": 600, "nodes": ["node-b"],
                  "flags": ["maint"], "description": "new drivers"},
        )
    )  # fmt: skip
    forever = submitted(bob, account="acct-b", **H100)
    reason = wait_reason(shared_cluster, forever, "ReqNodeNotAvail")
    assert "fix" in reason and "maintenance" in reason, reason
    short = submitted(bob, account="acct-b", time_limit_s=60, command=["sleep", "1"], **H100)
    done = shared_cluster.wait_final([short], timeout=60)[short]
    assert (done["state"], done["node"]) == ("succeeded", "node-b"), "it ends before the window"
    inside = alice.post(
        "/v1/jobs",
        json={"name": "r", "account": "acct-a", "command": SLEEP, "gpus": 1, "reservation": "fix"},
    )
    assert field_of(inside) == ["body", "reservation"]
    assert "maintenance window" in inside.text
    cancel_all(shared_cluster, [forever])
    assert ops.delete("/v1/reservations/fix").status_code == 204


def test_running_jobs_that_would_hold_its_gpus_are_named_unless_ignore_jobs(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops, bob = users["ops"], users["bob"]
    holder = submitted(bob, account="acct-b", **H100)
    shared_cluster.wait_state([holder], "running", timeout=30)
    body = {"name": "over", "start": iso(in_(3600)), "duration_s": 600, "nodes": ["node-b"],
            "users": ["alice"]}  # fmt: skip
    refused = ops.post("/v1/reservations", json=body)
    assert refused.status_code == 409, refused.text
    assert f"running job(s) {holder} will still hold its GPUs" in refused.json()["detail"]
    asked = ops.post(
        "/v1/reservations", json={**body, "nodes": None, "gpus": {"count": 2, "pool": "any"}}
    )
    assert asked.status_code == 201, "four A100s are free: it takes two of them"
    assert {g["node"] for g in asked.json()["gpus"]} == {"node-a"}
    assert ops.delete("/v1/reservations/over").status_code == 204
    anyway = made(ops.post("/v1/reservations", json={**body, "flags": ["ignore_jobs"]}))
    assert anyway["flags"] == ["ignore_jobs"] and anyway["nodes"] == ["node-b"]
    assert shared_cluster.job(holder)["state"] == "running", "it runs on"
    assert ops.delete("/v1/reservations/over").status_code == 204
    cancel_all(shared_cluster, [holder])


def test_deleting_a_reservation_cancels_its_waiting_jobs_and_the_audit_passes(
    shared_cluster: Cluster, users: dict[str, httpx.Client]
) -> None:
    ops, alice = users["ops"], users["alice"]
    made(
        ops.post(
            "/v1/reservations",
            json={"name": "gone", "start": iso(in_(3600)), "duration_s": 600,
                  "gpus": {"count": 1}, "users": ["alice"]},
        )
    )  # fmt: skip
    waiting = submitted(alice, account="acct-a", gpus=1, reservation="gone")
    wait_reason(shared_cluster, waiting, "Reservation")
    assert ops.delete("/v1/reservations/gone").status_code == 204
    ended = shared_cluster.wait_final([waiting], timeout=30)[waiting]
    assert ended["state"] == "cancelled"
    assert str(ended["reason"]).startswith("ReservationGone"), ended

    audit = CliRunner().invoke(app, ["audit", "--nats", shared_cluster.nats_url])
    assert audit.exit_code == 0, audit.output
    assert "0 mismatches" in audit.output, audit.output

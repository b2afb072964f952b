"""`gpuloom reservation ...` and `submit --reservation`, against a fake gateway that
records what it was sent: the bodies the options make, the tables and JSON printed,
times and durations as an operator writes them, and usage errors before any request."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
import typer
from typer.testing import CliRunner, Result

from gpuloom.client.cli import app
from gpuloom.client.context import CliState
from gpuloom.client.reservationcmds import parse_duration, parse_time

RESERVATION = {
    "name": "train",
    "start": "2027-01-04T08:00:00Z",
    "end": "2027-01-04T16:00:00Z",
    "gpus": [{"node": "node-b", "index": 0}, {"node": "node-b", "index": 1}],
    "nodes": ["node-b"],
    "users": [],
    "accounts": ["research"],
    "flags": ["ignore_jobs"],
    "description": "the big run",
    "started": False,
    "state": "pending",
}


class Recorder:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path, method = request.url.path, request.method
        if path == "/v1/reservations" and method == "GET":
            return httpx.Response(200, json={"reservations": [RESERVATION]})
        if path.startswith("/v1/reservations") and method == "DELETE":
            return httpx.Response(204)
        if "forbidden" in path or "forbidden" in request.content.decode():
            return httpx.Response(403, json={"detail": "bob may not make reservations: ..."})
        if path.startswith("/v1/reservations"):
            return httpx.Response(201 if method == "POST" else 200, json=RESERVATION)
        return httpx.Response(202, json={"id": "01JNEW", "state": "submitted"})

    def body(self, number: int = -1) -> Any:
        return json.loads(self.requests[number].content)


def run(args: list[str]) -> tuple[Result, Recorder]:
    recorder = Recorder()
    state = CliState(transport=httpx.MockTransport(recorder.handle), poll_interval_s=0)
    return CliRunner().invoke(app, args, obj=state), recorder


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("45m", 2700), ("2h", 7200), ("1d12h", 129_600), ("1h30m", 5400)],
)
def test_a_duration_is_seconds_or_units(text: str, seconds: int) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "0", "2x", "h", "1.5h", "-3"])
def test_a_duration_that_is_none_is_a_usage_error(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_duration(text)


def test_a_time_is_now_now_plus_a_duration_or_iso_with_its_offset() -> None:
    now = datetime(2027, 1, 4, 8, tzinfo=UTC)
    assert parse_time("now", now) == "now"
    assert parse_time("now+90m", now) == "2027-01-04T09:30:00+00:00"
    assert parse_time("2027-01-04T09:00+01:00") == "2027-01-04T09:00:00+01:00"
    local = datetime.fromisoformat(parse_time("2027-01-04T09:00"))
    assert local.tzinfo is not None and local.hour == 9, "no offset: local time"
    with pytest.raises(typer.BadParameter):
        parse_time("tomorrow")


def test_create_sends_a_number_of_gpus_and_shows_what_the_log_has() -> None:
    result, recorder = run(
        [
            "reservation", "create", "train", "--start", "2027-01-04T08:00Z", "--duration", "8h",
            "--gpus", "2", "--gpu-model", "H100-80GB", "--topology", "rack",
            "--accounts", "research", "--ignore-jobs", "--description", "the big run",
        ]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    request = recorder.requests[0]
    assert (request.method, request.url.path) == ("POST", "/v1/reservations")
    assert recorder.body() == {
        "name": "train",
        "start": "2027-01-04T08:00:00+00:00",
        "duration_s": 28_800,
        "gpus": {"count": 2, "gpu_model": ["H100-80GB"], "topology_level": "rack"},
        "accounts": ["research"],
        "description": "the big run",
        "flags": ["ignore_jobs"],
    }
    assert "node-b/0, node-b/1" in result.stdout and "pending" in result.stdout


def test_create_on_nodes_now_as_a_maintenance_window() -> None:
    result, recorder = run(
        ["reservation", "create", "fix", "--end", "2027-01-04T10:00Z", "--nodes", "node-a,node-b",
         "--maint", "--json"]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert recorder.body() == {
        "name": "fix",
        "start": "now",
        "end": "2027-01-04T10:00:00+00:00",
        "nodes": ["node-a", "node-b"],
        "flags": ["maint"],
    }
    assert json.loads(result.stdout) == RESERVATION


@pytest.mark.parametrize(
    "args",
    [
        ["--nodes", "node-a"],
        ["--duration", "1h"],
        ["--duration", "1h", "--end", "now+2h", "--nodes", "node-a"],
        ["--duration", "1h", "--nodes", "node-a", "--gpus", "1"],
        ["--duration", "1h", "--nodes", "node-a", "--topology", "rack"],
        ["--duration", "soon", "--nodes", "node-a"],
    ],
    ids=[
        "no end nor duration",
        "no nodes nor gpus",
        "an end and a duration",
        "nodes and gpus",
        "a topology without gpus",
        "a duration that is none",
    ],
)
def test_create_refuses_what_the_gateway_would_as_a_usage_error(args: list[str]) -> None:
    result, recorder = run(["reservation", "create", "r", *args])
    assert result.exit_code == 2, result.output
    assert recorder.requests == []


def test_list_show_and_delete() -> None:
    listed, recorder = run(["reservation", "list"])
    assert listed.exit_code == 0, listed.output
    row = next(line for line in listed.stdout.splitlines() if "train" in line)
    assert "pending" in row and "node-b" in row and "research" in row and "ignore_jobs" in row
    as_json, _ = run(["reservation", "list", "--json"])
    assert json.loads(as_json.stdout) == {"reservations": [RESERVATION]}
    shown, recorder = run(["reservation", "show", "train"])
    assert shown.exit_code == 0 and "the big run" in shown.stdout
    assert recorder.requests[0].url.path == "/v1/reservations/train"
    deleted, recorder = run(["reservation", "delete", "train"])
    assert deleted.exit_code == 0, deleted.output
    assert (recorder.requests[0].method, recorder.requests[0].url.path) == (
        "DELETE",
        "/v1/reservations/train",
    )
    assert "reservation train deleted" in deleted.stdout


def test_update_sends_only_what_changes_and_a_flag_over_the_others() -> None:
    result, recorder = run(
        ["reservation", "update", "train", "--duration", "12h", "--users", "alice", "--maint"]
    )
    assert result.exit_code == 0, result.output
    assert [(r.method, r.url.path) for r in recorder.requests] == [
        ("GET", "/v1/reservations/train"),
        ("PATCH", "/v1/reservations/train"),
    ]
    assert recorder.body() == {
        "duration_s": 43_200,
        "users": ["alice"],
        "flags": ["ignore_jobs", "maint"],
    }
    cleared, recorder = run(["reservation", "update", "train", "--no-ignore-jobs"])
    assert cleared.exit_code == 0 and recorder.body() == {"flags": []}


def test_a_refusal_is_one_line_and_submit_names_the_reservation() -> None:
    refused, _ = run(["reservation", "create", "forbidden", "--duration", "1h", "--nodes", "n"])
    assert refused.exit_code == 1
    assert "may not make reservations" in refused.stderr
    submitted, recorder = run(["submit", "--reservation", "train", "--gpus", "2", "--", "true"])
    assert submitted.exit_code == 0, submitted.output
    assert recorder.body()["reservation"] == "train"

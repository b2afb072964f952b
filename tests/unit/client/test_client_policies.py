"""`gpuloom priority-class ...`, `gpuloom limits ...` and `submit --priority-class`,
against a fake gateway that records what it was sent."""

from __future__ import annotations

import json
from typing import Any

import httpx
from typer.testing import CliRunner, Result

from gpuloom.client.cli import app
from gpuloom.client.context import CliState

CLASSES = {
    "classes": [
        {
            "name": "batch",
            "priority": 10,
            "may_preempt": False,
            "users": [],
            "accounts": ["research"],
            "description": "overnight runs",
            "default": True,
            "builtin": False,
        },
        {
            "name": "normal",
            "priority": 0,
            "may_preempt": True,
            "users": [],
            "accounts": [],
            "description": "built in",
            "default": False,
            "builtin": True,
        },
    ],
    "default": "batch",
}
LIMITS = {
    "limits": [
        {
            "scope": "user",
            "name": "alice",
            "max_submit_jobs": 10,
            "max_array_size": None,
            "max_gpus": 4,
        }
    ]
}


class Recorder:
    def __init__(self) -> None:
        self.requests: list[httpx.Request] = []

    def handle(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if request.url.path.startswith("/v1/priority-classes"):
            if request.method == "PUT" and "forbidden" in request.url.path:
                return httpx.Response(
                    403, json={"detail": "bob may not define priority classes: it needs ..."}
                )
            return httpx.Response(200, json=CLASSES)
        if request.url.path.startswith("/v1/limits"):
            return httpx.Response(200, json=LIMITS)
        return httpx.Response(202, json={"id": "01JNEW", "state": "submitted"})

    def body(self) -> Any:
        return json.loads(self.requests[-1].content)


def run(args: list[str]) -> tuple[Result, Recorder]:
    recorder = Recorder()
    state = CliState(transport=httpx.MockTransport(recorder.handle), poll_interval_s=0)
    return CliRunner().invoke(app, args, obj=state), recorder


def test_priority_class_list_shows_who_may_use_each_and_the_default() -> None:
    result, recorder = run(["priority-class", "list"])
    assert result.exit_code == 0, result.output
    assert (recorder.requests[0].method, recorder.requests[0].url.path) == (
        "GET",
        "/v1/priority-classes",
    )
    batch = next(line for line in result.stdout.splitlines() if "batch" in line)
    assert "research" in batch and "no" in batch and "yes" in batch
    normal = next(line for line in result.stdout.splitlines() if "normal" in line)
    assert "everyone" in normal


def test_priority_class_set_sends_the_whole_class() -> None:
    result, recorder = run(
        [
            "priority-class", "set", "batch", "--priority", "10", "--no-preempt",
            "--accounts", "research,ops", "--description", "overnight runs", "--default",
        ]
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    request = recorder.requests[0]
    assert (request.method, request.url.path) == ("PUT", "/v1/priority-classes/batch")
    assert recorder.body() == {
        "priority": 10,
        "may_preempt": False,
        "users": [],
        "accounts": ["research", "ops"],
        "description": "overnight runs",
        "default": True,
    }


def test_priority_class_delete_and_a_refusal_is_one_line() -> None:
    result, recorder = run(["priority-class", "delete", "batch"])
    assert result.exit_code == 0, result.output
    assert recorder.requests[0].method == "DELETE"
    refused, _ = run(["priority-class", "set", "forbidden", "--priority", "1"])
    assert refused.exit_code == 1
    assert "may not define priority classes" in refused.stderr


def test_limits_set_and_list() -> None:
    result, recorder = run(
        ["limits", "set", "user", "alice", "--max-submit-jobs", "10", "--max-gpus", "4"]
    )
    assert result.exit_code == 0, result.output
    request = recorder.requests[0]
    assert (request.method, request.url.path) == ("PUT", "/v1/limits/user/alice")
    assert recorder.body() == {"max_submit_jobs": 10, "max_array_size": None, "max_gpus": 4}
    listed, _ = run(["limits", "list", "--json"])
    assert json.loads(listed.stdout) == LIMITS


def test_limits_set_refuses_an_unknown_scope_as_a_usage_error() -> None:
    result, recorder = run(["limits", "set", "group", "x", "--max-gpus", "1"])
    assert result.exit_code == 2
    assert recorder.requests == []


def test_submit_sends_the_priority_class_and_leaves_the_priority_to_it() -> None:
    result, recorder = run(["submit", "--priority-class", "batch", "--", "true"])
    assert result.exit_code == 0, result.output
    body = recorder.body()
    assert body["priority_class"] == "batch"
    assert "priority" not in body, "the class's priority applies"

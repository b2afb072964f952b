"""Log requests: tails of a replica's attempt's stdout and stderr (the latest by default)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from services.agent.logs import answer
from services.agent.shim import RunDir


@pytest.fixture
def root(tmp_path: Path) -> Path:
    for attempt, text in ((1, "first try\n"), (2, "second try\n")):
        run = RunDir(tmp_path, "node-a", "j1", attempt)
        run.create()
        run.file("stdout").write_text(text * 3)
        run.file("stderr").write_bytes(b"bad byte \xff\n")
    other = RunDir(tmp_path, "node-a", "j1", 1, replica=2)  # a gang's replica 2 ran here
    other.create()
    other.file("stdout").write_text("replica 2\n")
    return tmp_path


def ask(root: Path, request: object, max_payload: int = 1 << 20) -> dict[str, Any]:
    raw = request if isinstance(request, bytes) else orjson.dumps(request)
    reply: dict[str, Any] = orjson.loads(answer(root, "node-a", raw, max_payload))
    return reply


def test_the_latest_attempt_is_answered(root: Path) -> None:
    assert ask(root, {"job_id": "j1"}) == {
        "job_id": "j1",
        "replica": 0,
        "attempts": [1, 2],
        "found": True,
        "attempt": 2,
        "stdout": "second try\n" * 3,
        "stderr": "bad byte \ufffd\n",
    }


def test_an_earlier_attempt_and_another_replica_are_answered(root: Path) -> None:
    assert ask(root, {"job_id": "j1", "attempt": 1})["stdout"] == "first try\n" * 3
    replica = ask(root, {"job_id": "j1", "replica": 2})
    assert (replica["attempt"], replica["attempts"], replica["stdout"]) == (1, [1], "replica 2\n")
    missing = ask(root, {"job_id": "j1", "replica": 2, "attempt": 2})
    assert (missing["found"], missing["attempt"], missing["attempts"]) == (False, None, [1])


def test_only_the_tail_is_sent(root: Path) -> None:
    assert ask(root, {"job_id": "j1", "tail_bytes": 11})["stdout"] == "second try\n"


def test_an_unknown_job_is_not_found(root: Path) -> None:
    assert ask(root, {"job_id": "nope"}) == {
        "job_id": "nope",
        "replica": 0,
        "attempts": [],
        "found": False,
        "attempt": None,
        "stdout": "",
        "stderr": "",
    }


@pytest.mark.parametrize(
    "request_body",
    [
        b"not json",
        {"tail_bytes": 5},
        {"job_id": "../../etc"},
        {"job_id": "j1", "tail_bytes": -1},
        {"job_id": "j1", "replica": -1},
        {"job_id": "j1", "attempt": 0},
    ],
    ids=["not JSON", "no job id", "a path for a job id", "negative tail", "replica", "attempt"],
)
def test_a_malformed_request_gets_an_error(root: Path, request_body: object) -> None:
    reply = ask(root, request_body)

    assert list(reply) == ["error"] and "malformed logs request" in reply["error"]


def test_the_reply_fits_the_largest_message(root: Path) -> None:
    big = RunDir(root, "node-a", "big", 1)
    big.create()
    big.file("stdout").write_text("x" * 100_000)

    reply = answer(root, "node-a", orjson.dumps({"job_id": "big"}), max_payload=10_000)

    assert len(reply) <= 10_000
    assert 2_500 <= len(orjson.loads(reply)["stdout"]) < 10_000

"""`gpuloom deadletters` against a fake gateway: the request it sends and what it prints."""

from __future__ import annotations

import json

import httpx
from typer.testing import CliRunner, Result

from gpuloom.client.cli import app
from gpuloom.client.context import CliState

ANSWER = {
    "stream": "GPULOOM_DLQ",
    "total": 2,
    "dead_letters": [
        {
            "dlq_seq": 2,
            "service": "inventory",
            "source": "heartbeat",
            "seq": None,
            "subject": "gpuloom.hb.bad",
            "reason_kind": "heartbeat",
            "reason": "node [bold]x[/bold]: not a subject token",
            "at": "2026-12-03T10:00:01+00:00",
        },
        {
            "dlq_seq": 1,
            "service": "queue",
            "source": "log",
            "seq": 17,
            "subject": "gpuloom.evt.job.x.JobSubmitted",
            "reason_kind": "malformed",
            "reason": "seq 17: not an event envelope",
            "at": "2026-12-03T10:00:00+00:00",
        },
    ],
}


def run(args: list[str]) -> tuple[list[httpx.Request], Result]:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=ANSWER)

    state = CliState(url="http://gw", transport=httpx.MockTransport(handler))
    return seen, CliRunner().invoke(app, args, obj=state)


def test_deadletters_asks_for_the_newest_n_and_prints_the_json_as_is() -> None:
    seen, result = run(["deadletters", "--limit", "7", "--json"])
    assert result.exit_code == 0, result.output
    assert (seen[0].url.path, seen[0].url.params["limit"]) == ("/v1/deadletters", "7")
    assert json.loads(result.stdout) == ANSWER


def test_deadletters_prints_one_row_each_with_markup_shown_as_text() -> None:
    _, result = run(["deadletters"])
    out = result.stdout
    assert result.exit_code == 0, out
    assert "2 dead letters in GPULOOM_DLQ" in out
    assert "gpuloom.hb.bad" in out and "17" in out and "malformed" in out
    assert "[bold]x[/bold]" in out, "a reason is shown as sent, not as markup"

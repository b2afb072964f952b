"""The CLI and tokens: `gpuloom token issue`, which token each request carries
(GPULOOM_TOKEN, else the token file), and what a 401 or a 403 prints."""

from __future__ import annotations

import stat
from pathlib import Path

import httpx
import pytest
from fakegateway import FakeGateway, Invoke
from typer.testing import CliRunner

from gpuloom.auth import OPERATOR, Principal, TokenVerifier, ensure_secret
from gpuloom.client.cli import app
from gpuloom.client.context import CliState
from gpuloom.client.tokencmds import parse_duration


@pytest.fixture
def stack_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> bytes:
    monkeypatch.setenv("GPULOOM_DATA_DIR", str(tmp_path / "data"))
    return ensure_secret(tmp_path / "data" / "auth" / "jwt.key")


def test_token_issue_signs_with_the_stacks_key(stack_key: bytes) -> None:
    result = CliRunner().invoke(app, ["token", "issue", "--user", "bob", "--role", "operator"])
    assert result.exit_code == 0, result.output
    principal = TokenVerifier(secret=stack_key).verify(result.stdout.strip())
    assert principal == Principal("bob", frozenset({OPERATOR}))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ttl", "31d"], "not within 1 s and the 2592000 s allowed"),
        (["--ttl", "soon"], "is not a duration"),
        (["--role", "root"], "unknown role"),
    ],
    ids=["a ttl over the maximum", "a ttl that is no duration", "an unknown role"],
)
def test_token_issue_refuses(stack_key: bytes, args: list[str], message: str) -> None:
    result = CliRunner().invoke(app, ["token", "issue", "--user", "bob", *args])
    assert result.exit_code == 2
    assert message in result.stderr
    assert result.stdout == ""


def test_token_issue_without_the_stacks_key_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GPULOOM_DATA_DIR", str(tmp_path / "nowhere"))
    result = CliRunner().invoke(app, ["token", "issue", "--user", "bob"])
    assert result.exit_code == 1
    assert "start the gateway once" in result.stderr
    assert not (tmp_path / "nowhere" / "auth" / "jwt.key").exists()  # never made here


def test_durations() -> None:
    assert [parse_duration(t) for t in ("90", "90s", "30m", "8h", "7d")] == [
        90,
        90,
        1800,
        8 * 3600,
        7 * 86400,
    ]


def test_saved_token_is_private_and_sent_when_no_env_token(
    stack_key: bytes, tmp_path: Path, cli: Invoke, fake: FakeGateway
) -> None:
    issued = CliRunner().invoke(app, ["token", "issue", "--user", "alice", "--save"])
    assert issued.exit_code == 0, issued.output
    saved = tmp_path / "config" / "gpuloom" / "token"  # XDG_CONFIG_HOME from conftest
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert cli(["jobs"]).exit_code == 0
    assert fake.requests[-1].headers["Authorization"] == f"Bearer {issued.stdout.strip()}"


def test_the_env_token_wins_over_the_file(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cli: Invoke, fake: FakeGateway
) -> None:
    (tmp_path / "config" / "gpuloom").mkdir(parents=True)
    (tmp_path / "config" / "gpuloom" / "token").write_text("from-file\n")
    monkeypatch.setenv("GPULOOM_TOKEN", "from-env")
    assert cli(["jobs"]).exit_code == 0
    assert fake.requests[-1].headers["Authorization"] == "Bearer from-env"


def test_no_token_at_all_sends_none(cli: Invoke, fake: FakeGateway) -> None:
    assert cli(["jobs"]).exit_code == 0
    assert "Authorization" not in fake.requests[-1].headers


@pytest.mark.parametrize(
    ("status", "detail", "printed"),
    [
        (401, "Signature has expired", "not authenticated: Signature has expired"),
        (403, "alice may not cordon nodes", "not allowed: alice may not cordon nodes (HTTP 403)"),
    ],
)
def test_401_and_403_print_what_went_wrong(status: int, detail: str, printed: str) -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        problem = {"type": "about:blank", "title": "", "status": status, "detail": detail}
        return httpx.Response(status, json=problem)

    state = CliState(transport=httpx.MockTransport(answer), poll_interval_s=0)
    result = CliRunner().invoke(app, ["cordon", "node-a"], obj=state)
    assert result.exit_code == 1
    assert printed in " ".join(result.stderr.split())
    if status == 401:
        assert "GPULOOM_TOKEN" in result.stderr and "gpuloom token issue" in result.stderr

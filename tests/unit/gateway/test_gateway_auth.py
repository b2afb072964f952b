"""The gateway's authentication in process (no NATS, no lifespan): 401 with the
RFC 6750 challenge, 403 with the reason, the public routes, `auth=off`, the secret."""

from __future__ import annotations

import logging
import stat
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts

from gpuloom.auth import OPERATOR, issue_token, read_secret
from gpuloom.config import Settings
from services.gateway.app import create_app
from services.gateway.auth import authenticate

PUBLIC = {"/healthz", "/readyz", "/docs", "/redoc", "/docs/oauth2-redirect", "/ui"}


def make(tmp_path: Path, **settings: object) -> FastAPI:
    return create_app(
        Settings(
            database_url=f"sqlite+aiosqlite:///{tmp_path}/gw.db", data_dir=tmp_path, **settings
        )
    )


async def call(
    app: FastAPI,
    method: str,
    path: str,
    token: str | None = None,
    authorization: str | None = None,
    host: str | None = None,
    **kw: object,
) -> httpx.Response:
    headers = (
        {"Authorization": authorization or f"Bearer {token}"} if token or authorization else {}
    )
    if host is not None:
        headers["Host"] = host
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        return await http.request(method, path, headers=headers, **kw)  # type: ignore[arg-type]


def token(tmp_path: Path, user: str, roles: list[str], ttl_s: int = 600, **kw: object) -> str:
    secret = read_secret(tmp_path / "auth" / "jwt.key")
    return issue_token(secret, user, now=kw.get("now", datetime.now(UTC)), ttl_s=ttl_s, roles=roles)  # type: ignore[arg-type]


def open_routes(app: FastAPI) -> set[str]:
    """Paths of the routes whose dependencies do not include `authenticate`."""
    found = set()
    for route in iter_route_contexts(app.routes):
        dependant = getattr(route, "dependant", None)
        if dependant is None:  # /openapi.json, the docs' static files
            continue
        stack, guarded = list(dependant.dependencies), False
        while stack and not guarded:
            sub = stack.pop()
            guarded = sub.call is authenticate
            stack.extend(sub.dependencies)
        if not guarded:
            found.add(route.path)
    return found


def test_every_route_but_the_public_ones_needs_a_token(tmp_path: Path) -> None:
    """Structural: a route outside the `authenticate` dependency must be listed here."""
    assert open_routes(make(tmp_path)) == PUBLIC  # /metrics needs a token by default
    assert open_routes(make(tmp_path, metrics_public=True)) == PUBLIC | {"/metrics"}


async def test_no_token_is_answered_401_with_a_bearer_challenge(tmp_path: Path) -> None:
    app = make(tmp_path)
    answer = await call(app, "POST", "/v1/jobs", json={"nonsense": True})
    assert answer.status_code == 401  # before the body is looked at
    assert answer.headers["www-authenticate"] == 'Bearer realm="gpuloom"'
    assert answer.headers["content-type"] == "application/problem+json"
    body = answer.json()
    assert body["status"] == 401 and body["title"] == "Unauthorized"
    assert "bearer token" in body["detail"]


@pytest.mark.parametrize("kind", ["garbage", "expired", "another key", "basic auth"])
async def test_a_token_that_proves_nothing_is_answered_401_invalid_token(
    tmp_path: Path, kind: str
) -> None:
    app = make(tmp_path)
    now = datetime.now(UTC)
    bad = {
        "garbage": "abc.def.ghi",
        "expired": issue_token(
            read_secret(tmp_path / "auth" / "jwt.key"),
            "alice",
            now=now - timedelta(hours=2),
            ttl_s=600,
        ),
        "another key": issue_token(b"x" * 43, "alice", now=now, ttl_s=600),
        "basic auth": None,
    }[kind]
    if bad is None:
        answer = await call(app, "GET", "/v1/jobs", authorization="Basic YTpi")
    else:
        answer = await call(app, "GET", "/v1/jobs", bad)
    assert answer.status_code == 401
    challenge = answer.headers["www-authenticate"]
    assert challenge.startswith('Bearer realm="gpuloom"')
    if kind != "basic auth":
        assert 'error="invalid_token", error_description="' in challenge
        assert answer.json()["detail"]


async def test_public_routes_answer_without_a_token(tmp_path: Path) -> None:
    app = make(tmp_path)
    for path in ("/healthz", "/openapi.json", "/docs"):
        assert (await call(app, "GET", path)).status_code == 200, path
    assert (await call(app, "GET", "/readyz")).status_code == 503  # no projector: not 401
    assert (await call(app, "GET", "/metrics")).status_code == 401
    assert (await call(app, "GET", "/metrics", token(tmp_path, "alice", []))).status_code == 200
    public = make(tmp_path, metrics_public=True)
    assert (await call(public, "GET", "/metrics")).status_code == 200


async def test_a_host_the_gateway_does_not_answer_to_gets_400(tmp_path: Path) -> None:
    """A page whose name was rebound to the gateway's address sends its own Host."""
    app = make(tmp_path)  # on loopback: localhost, 127.0.0.1, ::1
    answer = await call(app, "GET", "/healthz", host="rebound.example")
    assert answer.status_code == 400
    for host in ("localhost:8080", "127.0.0.1", "[::1]:8080"):
        assert (await call(app, "GET", "/healthz", host=host)).status_code == 200, host
    listed = make(tmp_path, gateway_allowed_hosts=["gpu.example.org"])
    assert (await call(listed, "GET", "/healthz", host="gpu.example.org")).status_code == 200
    assert (await call(listed, "GET", "/healthz", host="localhost")).status_code == 400
    anywhere = make(tmp_path, gateway_host="0.0.0.0")
    assert (await call(anywhere, "GET", "/healthz", host="rebound.example")).status_code == 200


async def test_an_operator_route_answers_403_with_the_reason(tmp_path: Path) -> None:
    app = make(tmp_path)
    user = token(tmp_path, "alice", [])
    answer = await call(app, "GET", "/v1/deadletters", user)
    assert answer.status_code == 403
    assert answer.json()["detail"] == (
        "alice may not read dead letters (they hold excerpts of any job): it needs the "
        "operator role"
    )
    operator = token(tmp_path, "ops", [OPERATOR])
    assert (await call(app, "GET", "/v1/deadletters", operator)).status_code == 503  # no NATS


async def test_the_secret_is_made_on_first_start(tmp_path: Path) -> None:
    make(tmp_path)
    path = tmp_path / "auth" / "jwt.key"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    before = path.read_bytes()
    make(tmp_path)
    assert path.read_bytes() == before


async def test_auth_off_is_explicit_and_warned_at_every_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="services.gateway.auth"):
        app = make(tmp_path, auth="off")
        make(tmp_path, auth="off")
    warnings = [r for r in caplog.records if "AUTHENTICATION IS OFF" in r.getMessage()]
    assert len(warnings) == 2
    assert not (tmp_path / "auth" / "jwt.key").exists()
    # anyone is the operator "anonymous": past authentication and the operator check
    assert (await call(app, "GET", "/v1/deadletters")).status_code == 503

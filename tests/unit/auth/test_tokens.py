"""Bearer tokens: what proves a principal and what does not (expired, another key,
claims missing, an algorithm not accepted, `none`), HS256 against the stack's
secret, RS256 and ES256 against a JWKS served over HTTP, and the clock skew allowed."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import stat
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from gpuloom.auth import (
    OPERATOR,
    Principal,
    TokenError,
    TokenVerifier,
    ensure_secret,
    issue_token,
    read_secret,
)

#: For tokens that are refused whenever they are checked (an hour out either way);
#: tokens that must be valid take the time when they are made (`claims`), since the
#: suite may reach them minutes after this module was imported.
NOW = datetime.now(UTC)
SECRET = b"s" * 43
OTHER = b"o" * 43


def claims(**changes: Any) -> dict[str, Any]:
    issued = int(datetime.now(UTC).timestamp())
    base: dict[str, Any] = {"sub": "alice", "roles": [], "iat": issued, "exp": issued + 600}
    base.update(changes)
    return {k: v for k, v in base.items() if v is not None}


def hs(payload: dict[str, Any], key: bytes = SECRET) -> str:
    return jwt.encode(payload, key, algorithm="HS256")


def test_a_token_of_the_stack_names_its_user_and_roles() -> None:
    verifier = TokenVerifier(secret=SECRET)
    token = issue_token(SECRET, "ops", now=datetime.now(UTC), ttl_s=60, roles=[OPERATOR])
    assert verifier.verify(token) == Principal("ops", frozenset({OPERATOR}))
    assert verifier.verify(hs(claims(roles=["operator", "wizard"]))).roles == {OPERATOR}
    assert verifier.verify(hs(claims(roles="operator"))).operator  # a space-separated string


REFUSED = {
    "expired": (hs(claims(iat=int(NOW.timestamp()) - 7200, exp=int(NOW.timestamp()) - 3600)),),
    "signed with another key": (hs(claims(), OTHER),),
    "without exp": (hs(claims(exp=None)),),
    "without iat": (hs(claims(iat=None)),),
    "without sub": (hs(claims(sub=None)),),
    "issued in the future": (
        hs(claims(iat=int(NOW.timestamp()) + 3600, exp=int(NOW.timestamp()) + 7200)),
    ),
    "alg none": (jwt.encode(claims(), None, algorithm="none"),),
    "alg HS512": (jwt.encode(claims(), SECRET * 2, algorithm="HS512"),),
    "malformed": ("not.a.token",),
    "a sub that is no user name": (hs(claims(sub="bad name!")),),
    "roles that are no list": (hs(claims(roles={"operator": True})),),
    "living longer than allowed": (hs(claims(exp=int(NOW.timestamp()) + 10 * 86400)),),
}


@pytest.mark.parametrize("token", [v[0] for v in REFUSED.values()], ids=list(REFUSED))
def test_tokens_that_prove_nothing_are_refused(token: str) -> None:
    verifier = TokenVerifier(secret=SECRET, max_lifetime_s=86400)
    with pytest.raises(TokenError):
        verifier.verify(token)


def test_a_bounded_clock_skew_is_allowed() -> None:
    past = int(datetime.now(UTC).timestamp())
    token = hs(claims(iat=past - 700, exp=past - 30))  # expired 30 s ago
    assert TokenVerifier(secret=SECRET, leeway_s=60).verify(token).name == "alice"
    with pytest.raises(TokenError, match="expired"):
        TokenVerifier(secret=SECRET, leeway_s=10).verify(token)


def test_issuer_and_audience_are_checked_when_configured() -> None:
    verifier = TokenVerifier(secret=SECRET, issuer="gpuloom", audience="cluster-1")
    good = hs(claims(iss="gpuloom", aud="cluster-1"))
    assert verifier.verify(good).name == "alice"
    for bad in (
        hs(claims(iss="gpuloom", aud="cluster-2")),
        hs(claims(iss="evil", aud="cluster-1")),
    ):
        with pytest.raises(TokenError):
            verifier.verify(bad)


def test_issue_refuses_unknown_roles_bad_users_and_no_lifetime() -> None:
    with pytest.raises(ValueError, match="unknown role"):
        issue_token(SECRET, "alice", now=NOW, ttl_s=60, roles=["root"])
    with pytest.raises(ValueError):
        issue_token(SECRET, "not a name", now=NOW, ttl_s=60)
    with pytest.raises(ValueError, match="positive"):
        issue_token(SECRET, "alice", now=NOW, ttl_s=0)


def test_the_secret_is_made_once_private_and_then_kept(tmp_path: Path) -> None:
    path = tmp_path / "auth" / "jwt.key"
    first = ensure_secret(path)
    assert len(first) >= 32
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert ensure_secret(path) == first == read_secret(path)
    assert [p.name for p in path.parent.iterdir()] == ["jwt.key"]  # no temporary left
    path.chmod(0o644)
    with pytest.raises(PermissionError, match="chmod 600"):
        read_secret(path)


# --- an identity provider's JWKS -------------------------------------------------------


class Keys:
    def __init__(self) -> None:
        self.rsa = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.ec = ec.generate_private_key(ec.SECP256R1())
        self.stranger = rsa.generate_private_key(public_exponent=65537, key_size=2048)

    def jwks(self) -> dict[str, Any]:
        rsa_jwk = json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(self.rsa.public_key()))
        ec_jwk = json.loads(jwt.algorithms.ECAlgorithm.to_jwk(self.ec.public_key()))
        rsa_jwk.update(kid="rsa-1", use="sig", alg="RS256")
        ec_jwk.update(kid="ec-1", use="sig", alg="ES256")
        return {"keys": [rsa_jwk, ec_jwk]}


@pytest.fixture(scope="module")
def keys() -> Keys:
    return Keys()


@pytest.fixture(scope="module")
def jwks_url(keys: Keys) -> Iterator[str]:
    body = json.dumps(keys.jwks()).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/jwks.json"
    server.shutdown()
    server.server_close()


def test_rs256_and_es256_tokens_are_verified_against_the_jwks(keys: Keys, jwks_url: str) -> None:
    verifier = TokenVerifier(jwks_url=jwks_url, issuer="https://idp", roles_claim="groups")
    assert verifier.uses_network
    payload = claims(iss="https://idp", groups=["operator"], roles=None)
    rs = jwt.encode(payload, keys.rsa, algorithm="RS256", headers={"kid": "rsa-1"})
    es = jwt.encode(payload, keys.ec, algorithm="ES256", headers={"kid": "ec-1"})
    assert verifier.verify(rs) == Principal("alice", frozenset({OPERATOR}))
    assert verifier.verify(es).name == "alice"


def test_jwks_refuses_foreign_keys_unknown_kids_and_the_stack_secret(
    keys: Keys, jwks_url: str
) -> None:
    verifier = TokenVerifier(jwks_url=jwks_url)
    forged = jwt.encode(claims(), keys.stranger, algorithm="RS256", headers={"kid": "rsa-1"})
    unknown = jwt.encode(claims(), keys.stranger, algorithm="RS256", headers={"kid": "nope"})
    for token in (forged, unknown, hs(claims()), jwt.encode(claims(), None, algorithm="none")):
        with pytest.raises(TokenError):
            verifier.verify(token)


def test_the_public_key_used_as_an_hmac_secret_is_refused(keys: Keys, jwks_url: str) -> None:
    """Algorithm confusion: HS256 is only ever checked against the stack's own secret."""
    pem = keys.rsa.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    header = {"alg": "HS256", "typ": "JWT", "kid": "rsa-1"}

    def b64(data: bytes) -> bytes:
        return base64.urlsafe_b64encode(data).rstrip(b"=")

    signing = b64(json.dumps(header).encode()) + b"." + b64(json.dumps(claims()).encode())
    token = (signing + b"." + b64(hmac.new(pem, signing, hashlib.sha256).digest())).decode()
    with pytest.raises(TokenError, match="not accepted"):
        TokenVerifier(jwks_url=jwks_url).verify(token)

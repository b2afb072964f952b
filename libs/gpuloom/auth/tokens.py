"""Bearer tokens: made by `gpuloom token issue` (HS256, the stack's own secret) or by
an organisation's identity provider (RS256/ES256, verified with its JWKS).

A token names its user in a configurable claim (default `sub`) and its roles in
another (default `roles`); `exp` and `iat` are required and a bounded clock skew
is allowed. Verification never trusts the token's own choice of algorithm: HS256
is checked only against the stack's secret, RS256/ES256 only against the JWKS.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jwt
from pydantic import TypeAdapter, ValidationError

from gpuloom.events.text import UserName

#: The role that may do everything, and act for other users (Slurm's SlurmUser/admin).
OPERATOR = "operator"
#: Roles a token may carry; every authenticated principal is a user. Coordinators
#: are not a token role: they are named per account in the log (as in Slurm).
KNOWN_ROLES = frozenset({OPERATOR})
#: Who signs the stack's own tokens.
ISSUER = "gpuloom"
SECRET_BYTES = 32
_ASYMMETRIC = ["RS256", "ES256"]
_user_name: TypeAdapter[str] = TypeAdapter(UserName)


class TokenError(ValueError):
    """A token that proves nothing: missing, malformed, expired, or signed by another key."""


@dataclass(frozen=True, slots=True)
class Principal:
    """An authenticated caller: a user name and the roles its token grants."""

    name: str
    roles: frozenset[str] = field(default_factory=frozenset)

    @property
    def operator(self) -> bool:
        return OPERATOR in self.roles


def ensure_secret(path: Path) -> bytes:
    """The stack's HS256 secret at `path`, made (random, mode 0600) when missing.

    Safe when several processes start at once: the secret is written whole to a
    private temporary file and linked into place, so no one reads half of it, and
    the first link wins.
    """
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    if path.exists():
        return read_secret(path)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_urlsafe(SECRET_BYTES) + "\n")
        with contextlib.suppress(FileExistsError):  # another process made it first
            os.link(temporary, path)
    finally:
        temporary.unlink(missing_ok=True)
    return read_secret(path)


def read_secret(path: Path) -> bytes:
    """The secret at `path`; refuses one that others may read (it signs operator tokens)."""
    mode = path.stat().st_mode & 0o077
    if mode:
        raise PermissionError(
            f"{path} is readable by others (mode {oct(path.stat().st_mode & 0o777)}): chmod 600 it"
        )
    secret = path.read_text().strip().encode()
    if len(secret) < SECRET_BYTES:
        raise ValueError(f"{path} holds a secret shorter than {SECRET_BYTES} bytes")
    return secret


def issue_token(
    secret: bytes,
    user: str,
    *,
    now: datetime,
    ttl_s: int,
    roles: Sequence[str] = (),
    user_claim: str = "sub",
    roles_claim: str = "roles",
) -> str:
    """An HS256 token for `user` with `roles`, valid `ttl_s` seconds from `now`."""
    _user_name.validate_python(user)
    unknown = sorted(set(roles) - KNOWN_ROLES)
    if unknown:
        raise ValueError(f"unknown role(s) {unknown}: known roles are {sorted(KNOWN_ROLES)}")
    if ttl_s <= 0:
        raise ValueError("a token's lifetime must be positive")
    issued = int(now.timestamp())
    claims = {
        user_claim: user,
        roles_claim: sorted(set(roles)),
        "iat": issued,
        "exp": issued + ttl_s,
        "iss": ISSUER,
        "jti": secrets.token_hex(8),
    }
    return jwt.encode(claims, secret, algorithm="HS256")


class TokenVerifier:
    """Checks bearer tokens against the stack's secret and/or an identity provider's JWKS."""

    def __init__(
        self,
        *,
        secret: bytes | None = None,
        jwks_url: str | None = None,
        issuer: str | None = None,
        audience: str | None = None,
        user_claim: str = "sub",
        roles_claim: str = "roles",
        leeway_s: float = 60.0,
        max_lifetime_s: int | None = None,
    ) -> None:
        if secret is None and jwks_url is None:
            raise ValueError("a token verifier needs a secret, a JWKS URL, or both")
        self._secret = secret
        self._jwks = jwt.PyJWKClient(jwks_url, cache_keys=True, lifespan=300) if jwks_url else None
        self.issuer = issuer
        self.audience = audience
        self.user_claim = user_claim
        self.roles_claim = roles_claim
        self.leeway_s = leeway_s
        self.max_lifetime_s = max_lifetime_s

    @property
    def uses_network(self) -> bool:
        """Whether `verify` may fetch keys (a JWKS): then call it in a thread."""
        return self._jwks is not None

    def verify(self, token: str) -> Principal:
        """The principal `token` proves, or TokenError saying why it proves nothing.

        With a JWKS this may fetch keys over the network (cached): call it off the
        event loop.
        """
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError as exc:
            raise TokenError(f"malformed token: {exc}") from exc
        algorithm = header.get("alg")
        key: Any
        if algorithm == "HS256" and self._secret is not None:
            key, algorithms = self._secret, ["HS256"]
        elif algorithm in _ASYMMETRIC and self._jwks is not None:
            try:
                key = self._jwks.get_signing_key_from_jwt(token).key
            except jwt.PyJWTError as exc:
                raise TokenError(f"no key of the identity provider verifies it: {exc}") from exc
            algorithms = _ASYMMETRIC
        else:
            raise TokenError(f"tokens signed with {algorithm!r} are not accepted here")
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=algorithms,
                leeway=self.leeway_s,
                issuer=self.issuer,
                audience=self.audience,
                options={
                    "require": ["exp", "iat", self.user_claim],
                    "verify_aud": self.audience is not None,
                },
            )
        except jwt.PyJWTError as exc:
            raise TokenError(str(exc)) from exc
        return self._principal(claims)

    def _principal(self, claims: dict[str, Any]) -> Principal:
        lifetime = claims["exp"] - claims["iat"]
        if self.max_lifetime_s is not None and lifetime > self.max_lifetime_s:
            raise TokenError(
                f"the token lives {lifetime} s, longer than the {self.max_lifetime_s} s allowed"
            )
        try:
            name = _user_name.validate_python(claims[self.user_claim])
        except ValidationError as exc:
            raise TokenError(f"claim {self.user_claim!r} is not a user name") from exc
        raw_roles = claims.get(self.roles_claim, [])
        if isinstance(raw_roles, str):
            raw_roles = raw_roles.split()
        if not isinstance(raw_roles, list) or not all(isinstance(r, str) for r in raw_roles):
            raise TokenError(f"claim {self.roles_claim!r} is not a list of role names")
        return Principal(name=name, roles=frozenset(raw_roles) & KNOWN_ROLES)

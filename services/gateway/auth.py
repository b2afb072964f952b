"""Who is asking: the bearer token of every request, checked once, as a dependency.

Every router is included with `authenticate` (app.py), so a route added to one is
protected without a word; /healthz, /readyz, the API docs and (when
`metrics_public`) /metrics are the only routes outside. A missing, malformed,
expired or foreign token is answered 401 with `WWW-Authenticate` (RFC 6750); an
act the principal may not do is answered 403 with the reason, by the routes,
which ask `gpuloom.auth.policy`.

`auth=off` is explicit: every request acts as the operator `anonymous`, and the
gateway says so in a WARNING at every start.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from gpuloom.auth import OPERATOR, Principal, TokenError, TokenVerifier, ensure_secret, read_secret
from gpuloom.auth.policy import Accounts, JobAct, job_problem, operator_only
from gpuloom.config import Settings
from services.gateway.deps import SettingsDep, VerifierDep
from services.gateway.refusals import Refused, answer, denied

log = logging.getLogger(__name__)

REALM = "gpuloom"
#: Who every request is when authentication is off.
ANONYMOUS = Principal(name="anonymous", roles=frozenset({OPERATOR}))
#: What may stand in a quoted `error_description` (RFC 6750 §3: no `"` nor `\`).
_UNQUOTABLE = re.compile(r"[^\x20\x21\x23-\x5b\x5d-\x7e]")

bearer = HTTPBearer(
    auto_error=False,
    bearerFormat="JWT",
    description="`gpuloom token issue --user NAME`, or a token of the identity provider",
)


def make_verifier(settings: Settings) -> TokenVerifier | None:
    """The verifier of `settings` (None with auth off).

    Without a JWKS the stack's own secret is made on first start. With one, the
    stack's secret is accepted too when its file exists (`gpuloom token issue`
    for operators), but never made.
    """
    if settings.auth == "off":
        log.warning(
            "AUTHENTICATION IS OFF (GPULOOM_AUTH=off): anyone who reaches this gateway "
            "acts as operator %r",
            ANONYMOUS.name,
        )
        return None
    path = settings.secret_file()
    if settings.auth_jwks_url is None:
        secret: bytes | None = ensure_secret(path)
    else:
        secret = read_secret(path) if path.exists() else None
    return TokenVerifier(
        secret=secret,
        jwks_url=settings.auth_jwks_url,
        issuer=settings.auth_issuer,
        audience=settings.auth_audience,
        user_claim=settings.auth_user_claim,
        roles_claim=settings.auth_roles_claim,
        leeway_s=settings.auth_leeway_s,
        max_lifetime_s=settings.auth_max_ttl_s,
    )


def unauthorized(description: str | None) -> HTTPException:
    """401 with the challenge of RFC 6750 §3: no error code when no token came at all."""
    challenge = f'Bearer realm="{REALM}"'
    if description is not None:
        quoted = _UNQUOTABLE.sub("?", description)[:200]
        challenge += f', error="invalid_token", error_description="{quoted}"'
    detail = description or "this route needs a bearer token (Authorization: Bearer <token>)"
    return HTTPException(status_code=401, detail=detail, headers={"WWW-Authenticate": challenge})


def forbidden(reason: str | None) -> None:
    """403 with `reason` raised, when the policy gave one (a command returns `denied`)."""
    answer(denied(reason))


async def authenticate(
    settings: SettingsDep,
    verifier: VerifierDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> Principal:
    """The principal the request's bearer token proves, else 401."""
    if settings.auth == "off":
        return ANONYMOUS
    if verifier is None:  # fail closed: a gateway built without its verifier
        raise unauthorized("this gateway has no way to verify tokens")
    if credentials is None:
        raise unauthorized(None)
    token = credentials.credentials
    try:
        if verifier.uses_network:
            return await asyncio.to_thread(verifier.verify, token)
        return verifier.verify(token)
    except TokenError as exc:
        raise unauthorized(str(exc)) from exc


PrincipalDep = Annotated[Principal, Depends(authenticate)]


def operator(what: str) -> Callable[[Principal], Awaitable[None]]:
    """A dependency that refuses (403) anyone but an operator to `what`."""

    async def check(principal: PrincipalDep) -> None:
        forbidden(operator_only(principal, what))

    return check


def job_refusal(
    accounts: Accounts, principal: Principal, act: JobAct, user: str, account: str
) -> Refused | None:
    """403 unless `principal` may `act` on a job of `user` under `account`, in the
    account tree `accounts` (`Reads.accounts`)."""
    return denied(job_problem(principal, act, user, account, accounts))

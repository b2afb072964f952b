"""/v1/webhooks: register a URL to receive the log's events, signed (docs/webhooks.md).

Anyone authenticated may register webhooks (at most `Settings.webhook_max_per_owner`); a webhook gets what
its owner may see of the event stream, with the stream's filters. Its owner and the
operators see it, its deliveries and their answers, and may delete it; to anyone else
it does not exist (404). The secret is answered once, when it is registered.

An operator's webhook sees everything only until the registering token expires
(`operator_until`, its `exp`); its owner renews that with a fresh operator token
(`POST /v1/webhooks/{id}/renew`, event WebhookRenewed). After it, it sees what its
owner sees as a plain user.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import jwt
from fastapi import APIRouter, Depends, HTTPException, Path, Query, Response
from fastapi.exceptions import RequestValidationError
from fastapi.security import HTTPAuthorizationCredentials
from pydantic import BaseModel, Field

from gpuloom.auth import Principal
from gpuloom.config import Settings
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.codec import new_event_id
from gpuloom.events.registry import EVENT_TYPES
from gpuloom.events.text import Remark
from gpuloom.events.webhooks import (
    TYPES_MAX,
    URL_MAX,
    WebhookDeleted,
    WebhookRegistered,
    WebhookRenewed,
)
from gpuloom.state.tenancy import Webhook
from gpuloom.webhooks.policy import url_problem
from gpuloom.webhooks.sealing import load_sealer
from gpuloom.webhooks.signing import SECRET_PATTERN, SecretError, new_secret, secret_key
from gpuloom.webhooks.transport import Refused, Unresolved, checked_address
from services.gateway.auth import PrincipalDep, bearer
from services.gateway.bodies import Body
from services.gateway.deps import PublisherDep, ReadsDep, SettingsDep
from services.gateway.reads import Reads
from services.gateway.refusals import answer
from services.gateway.schemas import Problem

router = APIRouter(tags=["webhooks"])

_PORT = "([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
#: What a webhook URL looks like: no credentials, no IPv6 literal (use a name), a port
#: in range. `policy.url_problem` says why another is refused, for the log's readers.
URL_PATTERN = rf"^https?://[A-Za-z0-9]([A-Za-z0-9.-]{{0,251}}[A-Za-z0-9])?(:{_PORT})?([/?][!-~]*)?$"
Token = Annotated[str, Field(pattern=SUBJECT_TOKEN.pattern)]
#: An event type's name (the schema lists them; `_check` names an unknown one).
EventType = Annotated[str, Field(json_schema_extra={"enum": sorted(EVENT_TYPES)})]
HookId = Annotated[str, Path(pattern=SUBJECT_TOKEN.pattern, description="a webhook's id")]
ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": Problem, "description": "no such webhook (or not yours)"},
    503: {"model": Problem, "description": "NATS unreachable, or the log not read yet"},
}


class WebhookBody(Body):
    """A webhook to register: where to POST, which events (the stream's filters), and
    optionally the secret to sign with (`whsec_` + base64 of 24-64 bytes; one is made
    when none is given)."""

    url: str = Field(
        min_length=8,
        max_length=URL_MAX,
        pattern=URL_PATTERN,
        examples=["https://ci.example.org/hook"],
        description="http(s), a host name or IPv4 address, an optional port, a path",
    )
    types: list[EventType] = Field(default_factory=list, max_length=TYPES_MAX)
    job: Token | None = None
    user: Token | None = None
    account: Token | None = None
    node: Token | None = None
    secret: str | None = Field(default=None, max_length=200, pattern=SECRET_PATTERN)
    description: Remark = ""


class WebhookView(BaseModel):
    id: str
    owner: str
    url: str
    types: list[str]
    job: str | None
    user: str | None
    account: str | None
    node: str | None
    description: str
    created_at: datetime
    #: Events after this sequence are delivered.
    after_seq: int
    #: Why it no longer delivers (a 410 from its receiver, a backlog), or null.
    disabled: str | None
    #: It sees every event (its owner registered or renewed it with an operator token),
    operator: bool
    #: until then (that token's expiry; null: no end). After it: what its owner sees as
    #: a plain user, until the owner renews it.
    operator_until: datetime | None


class WebhookCreated(WebhookView):
    #: The signing secret: shown this once.
    secret: str


class WebhookList(BaseModel):
    webhooks: list[WebhookView]


class AttemptView(BaseModel):
    attempt: int
    at: datetime
    status_code: int | None
    error: str | None
    response: str | None
    duration_ms: int


class DeliveryView(BaseModel):
    seq: int
    event_id: str
    type: str
    status: Literal["pending", "delivered", "failed", "dropped"]
    attempts: list[AttemptView]
    next_at: datetime | None
    created_at: datetime
    done_at: datetime | None


class DeliveryList(BaseModel):
    deliveries: list[DeliveryView]


def _view(hook: Webhook) -> dict[str, Any]:
    return {
        "id": hook.webhook_id,
        "owner": hook.owner,
        "url": hook.url,
        "types": list(hook.types),
        "job": hook.job,
        "user": hook.user,
        "account": hook.account,
        "node": hook.node,
        "description": hook.description,
        "created_at": hook.registered_at,
        "after_seq": hook.registered_seq,
        "disabled": hook.disabled,
        "operator": hook.operator,
        "operator_until": hook.operator_until,
    }


async def token_expiry(
    settings: SettingsDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> datetime | None:
    """The `exp` of the request's bearer token (verified by `authenticate` already), or
    None with authentication off."""
    if settings.auth == "off" or credentials is None:
        return None
    try:
        claims = jwt.decode(credentials.credentials, options={"verify_signature": False})
    except jwt.PyJWTError:
        return None
    exp = claims.get("exp")
    return datetime.fromtimestamp(exp, UTC) if isinstance(exp, int | float) else None


ExpiryDep = Annotated[datetime | None, Depends(token_expiry)]


def _mine(reads: Reads, hook_id: str, principal: Principal) -> Webhook:
    hook = reads.webhooks.hooks().get(hook_id)
    if hook is None or not (principal.operator or hook.owner == principal.name):
        raise HTTPException(status_code=404, detail=f"webhook {hook_id} not found")
    return hook


def _invalid(field: str, reason: str) -> RequestValidationError:
    return RequestValidationError([{"loc": ("body", field), "msg": reason, "type": "value_error"}])


async def _check(body: WebhookBody, settings: Settings) -> None:
    problem = url_problem(body.url)
    if problem is not None:
        raise _invalid("url", problem)
    try:
        await checked_address(body.url, settings.webhook_allow_private)
    except Unresolved:
        pass  # its name may be made later; each attempt says so until then
    except Refused as exc:  # the stack's rule, which an operator may change: 403
        raise HTTPException(status_code=403, detail=f"body.url: {exc}") from exc
    unknown = sorted(set(body.types) - set(EVENT_TYPES))
    if unknown:
        raise _invalid("types", f"unknown event type(s) {', '.join(unknown)}")
    if body.secret is not None:
        try:
            secret_key(body.secret)
        except SecretError as exc:
            raise _invalid("secret", str(exc)) from exc


@router.post(
    "/v1/webhooks",
    status_code=201,
    response_model=WebhookCreated,
    responses={
        **ERRORS,
        403: {"model": Problem, "description": "the URL's address is not one deliveries may go to"},
        409: {"model": Problem, "description": "too many webhooks"},
    },
)
async def register(
    body: WebhookBody,
    settings: SettingsDep,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
    expiry: ExpiryDep,
) -> Any:
    """Register a webhook (event WebhookRegistered): the events written from now on that
    pass its filter and that you may see are POSTed to `url`, signed with its secret."""
    await _check(body, settings)
    await reads.catch_up(principal.name)
    owned = sum(1 for hook in reads.webhooks.hooks().values() if hook.owner == principal.name)
    most = settings.webhook_max_per_owner
    if owned >= most:  # the state of your webhooks, not a rate: 409, delete one first
        raise HTTPException(
            status_code=409,
            detail=f"{principal.name} has {owned} webhooks, at most {most} may be registered "
            "(disabled ones count): delete one first",
        )
    hook_id = new_event_id()
    secret = body.secret or new_secret()
    event = WebhookRegistered(
        webhook_id=hook_id,
        owner=principal.name,
        operator=principal.operator,
        operator_until=expiry if principal.operator else None,
        url=body.url,
        types=body.types,
        job=body.job,
        user=body.user,
        account=body.account,
        node=body.node,
        secret_sealed=load_sealer(settings).seal(secret, hook_id),
        description=body.description,
    )
    answer(await publisher.publish(event, principal=principal))
    await reads.catch_up(principal.name)
    hook = reads.webhooks.hooks().get(hook_id)
    if hook is None:
        raise HTTPException(status_code=503, detail="the webhook is written; read it again shortly")
    return {**_view(hook), "secret": secret}


@router.get("/v1/webhooks", response_model=WebhookList)
async def list_webhooks(reads: ReadsDep, principal: PrincipalDep) -> Any:
    """Your webhooks (an operator's: everyone's)."""
    await reads.catch_up(principal.name)
    hooks = [
        _view(hook)
        for _, hook in sorted(reads.webhooks.hooks().items())
        if principal.operator or hook.owner == principal.name
    ]
    return {"webhooks": hooks}


@router.get("/v1/webhooks/{hook_id}", response_model=WebhookView, responses={**ERRORS})
async def get_webhook(hook_id: HookId, reads: ReadsDep, principal: PrincipalDep) -> Any:
    await reads.catch_up(principal.name)
    return _view(_mine(reads, hook_id, principal))


@router.delete("/v1/webhooks/{hook_id}", status_code=204, responses={**ERRORS})
async def delete_webhook(
    hook_id: HookId, publisher: PublisherDep, reads: ReadsDep, principal: PrincipalDep
) -> Response:
    """Delete a webhook (event WebhookDeleted): nothing more is delivered."""
    await reads.catch_up(principal.name)
    _mine(reads, hook_id, principal)
    answer(await publisher.publish(WebhookDeleted(webhook_id=hook_id), principal=principal))
    await reads.catch_up(principal.name)
    return Response(status_code=204)


@router.post(
    "/v1/webhooks/{hook_id}/renew",
    response_model=WebhookView,
    responses={
        **ERRORS,
        403: {"model": Problem, "description": "not its owner, or not an operator token"},
    },
)
async def renew(
    hook_id: HookId,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
    expiry: ExpiryDep,
) -> Any:
    """Renew an operator webhook's powers (event WebhookRenewed): with its owner's fresh
    operator token it sees every event again, until that token's expiry."""
    await reads.catch_up(principal.name)
    hook = _mine(reads, hook_id, principal)
    if hook.owner != principal.name:
        raise HTTPException(
            status_code=403, detail=f"only {hook.owner} renews this webhook (its powers are theirs)"
        )
    if not principal.operator:
        raise HTTPException(
            status_code=403,
            detail="renewing needs an operator token; without one the webhook sees what you see",
        )
    event = WebhookRenewed(webhook_id=hook_id, operator=True, operator_until=expiry)
    answer(await publisher.publish(event, principal=principal))
    await reads.catch_up(principal.name)
    return _view(_mine(reads, hook_id, principal))


@router.get("/v1/webhooks/{hook_id}/deliveries", response_model=DeliveryList, responses={**ERRORS})
async def deliveries(
    hook_id: HookId,
    reads: ReadsDep,
    principal: PrincipalDep,
    status: Annotated[Literal["pending", "delivered", "failed", "dropped"] | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Any:
    """The latest deliveries, newest first, each with its attempts and the answers."""
    await reads.catch_up(principal.name)
    _mine(reads, hook_id, principal)
    found = await reads.webhooks.deliveries(hook_id, status, limit)
    return {
        "deliveries": [
            {
                "seq": delivery.seq,
                "event_id": delivery.event_id,
                "type": delivery.event_type,
                "status": delivery.status,
                "attempts": [
                    AttemptView.model_validate(attempt, from_attributes=True)
                    for attempt in delivery.attempts
                ],
                "next_at": delivery.next_at,
                "created_at": delivery.created_at,
                "done_at": delivery.done_at,
            }
            for delivery in found
        ]
    }

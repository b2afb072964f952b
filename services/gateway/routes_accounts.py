"""/v1/accounts: the account hierarchy and fair-share shares (admin)."""

from __future__ import annotations

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field, ValidationError

from gpuloom.events import AccountCreated, AccountUsersSet, QuotaSet, SharesSet
from gpuloom.events.accounts import QUOTA_MAX
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.text import Remark, UserName
from gpuloom.queueing.quota import GPU_MILLI, RESOURCE
from gpuloom.state import ClusterState
from gpuloom.state.model import AccountState
from services.gateway.deps import AccountName, Gateway, GatewayDep
from services.gateway.publish import publish

router = APIRouter(prefix="/v1/accounts", tags=["accounts"])


class NewAccount(BaseModel):
    name: str = Field(pattern=SUBJECT_TOKEN.pattern)
    parent: str | None = Field(default=None, pattern=SUBJECT_TOKEN.pattern)
    shares: int = Field(default=1, ge=0, le=1_000_000)
    description: Remark = ""


class Shares(BaseModel):
    shares: int = Field(ge=0, le=1_000_000)


class QuotaBody(BaseModel):
    """A quota of `resource`: `gpu_milli` (1000 per whole GPU, the default), `gpus`
    (whole GPUs), `model:<name>` or `pool:vgpu|physical` (milli-GPU of that model or
    pool). `nominal` null removes the quota of that resource."""

    resource: str = Field(default=GPU_MILLI, pattern=RESOURCE.pattern)
    nominal: int | None = Field(default=None, ge=0, le=QUOTA_MAX)
    borrowing_limit: int | None = Field(default=None, ge=0, le=QUOTA_MAX)
    cap: int | None = Field(default=None, ge=0, le=QUOTA_MAX)


class Users(BaseModel):
    """Who may submit under the account; an empty list lets anyone."""

    users: list[UserName] = Field(default_factory=list, max_length=10_000)


class Account(BaseModel):
    name: str
    parent: str | None
    shares: int
    description: str
    #: Who may submit under it; empty: anyone.
    users: list[str] = Field(default_factory=list)
    #: The quota of all GPU time (`gpu_milli`), if set.
    quota: QuotaBody | None = None
    #: Every quota, by resource.
    quotas: list[QuotaBody] = Field(default_factory=list)


class AccountList(BaseModel):
    accounts: list[Account]


def _state(gateway: Gateway) -> ClusterState:
    if gateway.projector is None:
        raise HTTPException(status_code=503, detail="the gateway has not read the log yet")
    return gateway.projector.state


def _quotas(account: AccountState) -> list[QuotaBody]:
    return [
        QuotaBody(resource=resource, nominal=nominal, borrowing_limit=limit, cap=cap)
        for resource, (nominal, limit, cap) in sorted(account.quotas.items())
    ]


def _view(account: AccountState) -> Account:
    quotas = _quotas(account)
    return Account(
        name=account.name,
        parent=account.parent,
        shares=account.shares,
        description=account.description,
        quota=next((q for q in quotas if q.resource == GPU_MILLI), None),
        quotas=quotas,
        users=list(account.users),
    )


async def _require(gateway: Gateway, name: str) -> None:
    """404 unless the account exists (as far as the gateway's own writes go)."""
    await gateway.catch_up()
    if name not in _state(gateway).accounts:
        raise HTTPException(status_code=404, detail=f"account {name} not found")


async def _after_write(gateway: Gateway, name: str) -> Account:
    """The account as the log has it once the gateway's own writes are folded."""
    await gateway.catch_up()
    return _view(_state(gateway).accounts[name])


@router.get("", response_model=AccountList)
async def list_accounts(gateway: GatewayDep) -> AccountList:
    """Accounts created by admins, with their parent and shares."""
    await gateway.catch_up()
    state = _state(gateway)
    return AccountList(accounts=[_view(a) for _, a in sorted(state.accounts.items())])


@router.post("", status_code=201, response_model=Account)
async def create_account(body: NewAccount, gateway: GatewayDep) -> Account:
    """Create an account under `parent` (events AccountCreated, SharesSet)."""
    await gateway.catch_up()
    state = _state(gateway)
    if body.name in state.accounts:
        raise HTTPException(status_code=409, detail=f"account {body.name} already exists")
    if body.parent is not None and body.parent not in state.accounts:
        raise HTTPException(status_code=404, detail=f"parent account {body.parent} not found")
    created = await publish(
        gateway,
        AccountCreated(account=body.name, parent=body.parent, description=body.description),
    )
    reason = await gateway.voided_reason(created.seq)
    if reason is not None:  # created meanwhile by another request
        raise HTTPException(status_code=409, detail=reason)
    if body.shares != 1:
        await publish(gateway, SharesSet(account=body.name, shares=body.shares))
    return await _after_write(gateway, body.name)


@router.put("/{name}/shares", response_model=Account, responses={404: {}})
async def set_shares(name: AccountName, body: Shares, gateway: GatewayDep) -> Account:
    """Set the account's fair-share shares (event SharesSet)."""
    await _require(gateway, name)
    await publish(gateway, SharesSet(account=name, shares=body.shares))
    return await _after_write(gateway, name)


@router.put("/{name}/users", response_model=Account, responses={404: {}, 422: {}})
async def set_users(name: AccountName, body: Users, gateway: GatewayDep) -> Account:
    """Set who may submit under the account (event AccountUsersSet); [] lets anyone."""
    await _require(gateway, name)
    try:
        event = AccountUsersSet(account=name, users=body.users)
    except ValidationError as exc:
        raise HTTPException(status_code=422, detail=str(exc.errors()[0]["msg"])) from exc
    await publish(gateway, event)
    return await _after_write(gateway, name)


@router.put("/{name}/quota", response_model=Account, responses={404: {}})
async def set_quota(name: AccountName, body: QuotaBody, gateway: GatewayDep) -> Account:
    """Set the account's quota of one resource, borrowing limit and cap (event QuotaSet)."""
    await _require(gateway, name)
    await publish(
        gateway,
        QuotaSet(
            account=name,
            resource=body.resource,
            nominal=body.nominal,
            borrowing_limit=body.borrowing_limit,
            cap=body.cap,
        ),
    )
    return await _after_write(gateway, name)

"""/v1/accounts: the account hierarchy, members, coordinators, shares and quotas.

Anyone authenticated lists accounts; who may change what is `gpuloom.auth.policy`
(operators everything; an account's coordinators its members, sub-accounts and
their shares). Each write is a command (`_create`, `_change`) that returns its
refusal, which the route answers (`refusals.answer`)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from fastapi import APIRouter
from pydantic import BaseModel, Field, ValidationError

from gpuloom.auth import Principal
from gpuloom.auth.policy import AccountAct, account_problem
from gpuloom.events import (
    AccountCoordinatorsSet,
    AccountCreated,
    AccountUsersSet,
    Event,
    QuotaSet,
    SharesSet,
)
from gpuloom.events.accounts import GPU_MILLI, QUOTA_MAX, RESOURCE
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.text import Remark, UserName
from gpuloom.state.tenancy import AccountState
from services.gateway.auth import PrincipalDep
from services.gateway.bodies import Body
from services.gateway.deps import AccountName, PublisherDep, ReadsDep
from services.gateway.publish import Publisher
from services.gateway.reads import Reads
from services.gateway.refusals import Invalid, Refusal, Refused, answer, denied, not_found

router = APIRouter(prefix="/v1/accounts", tags=["accounts"])


class NewAccount(Body):
    name: str = Field(pattern=SUBJECT_TOKEN.pattern)
    parent: str | None = Field(default=None, pattern=SUBJECT_TOKEN.pattern)
    shares: int = Field(default=1, ge=0, le=1_000_000)
    description: Remark = ""


class Shares(Body):
    shares: int = Field(ge=0, le=1_000_000)


class QuotaBody(Body):
    """A quota of `resource`: `gpu_milli` (1000 per whole GPU, the default), `gpus`
    (whole GPUs), `model:<name>` or `pool:vgpu|physical` (milli-GPU of that model or
    pool). `nominal` null removes the quota of that resource."""

    resource: str = Field(default=GPU_MILLI, pattern=RESOURCE.pattern)
    nominal: int | None = Field(default=None, ge=0, le=QUOTA_MAX)
    borrowing_limit: int | None = Field(default=None, ge=0, le=QUOTA_MAX)
    cap: int | None = Field(default=None, ge=0, le=QUOTA_MAX)


class Users(Body):
    """Who may submit under the account; an empty list lets anyone."""

    users: list[UserName] = Field(default_factory=list, max_length=10_000)


class Coordinators(Body):
    """Who coordinates the account and every account below it; [] names none."""

    coordinators: list[UserName] = Field(default_factory=list, max_length=1000)


class Account(BaseModel):
    name: str
    parent: str | None
    shares: int
    description: str
    #: Who may submit under it; empty: anyone.
    users: list[str] = Field(default_factory=list)
    #: Who coordinates it and its sub-accounts (AccountCoordinatorsSet).
    coordinators: list[str] = Field(default_factory=list)
    #: The quota of all GPU time (`gpu_milli`), if set.
    quota: QuotaBody | None = None
    #: Every quota, by resource.
    quotas: list[QuotaBody] = Field(default_factory=list)


class AccountList(BaseModel):
    accounts: list[Account]


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
        coordinators=list(account.coordinators),
    )


async def _require(reads: Reads, name: str, principal: Principal) -> Refused | None:
    """404 unless the account exists (as far as the caller's own writes go)."""
    await reads.catch_up(principal.name)
    accounts = reads.policies.account_tree()
    if isinstance(accounts, Refused):
        return accounts
    return not_found(f"account {name}") if name not in accounts else None


async def _after_write(reads: Reads, name: str, principal: Principal) -> Account:
    """The account as the log has it once the caller's own writes are folded."""
    await reads.catch_up(principal.name)
    return _view(answer(reads.policies.account_tree())[name])


async def _create(
    publisher: Publisher, reads: Reads, body: NewAccount, principal: Principal
) -> Refusal | None:
    """The command of POST /v1/accounts: None once written, else the refusal."""
    await reads.catch_up(principal.name)
    accounts = reads.policies.account_tree()
    if isinstance(accounts, Refused):
        return accounts
    refused = denied(account_problem(principal, "create", body.name, accounts, body.parent))
    if refused is not None:
        return refused
    if body.name in accounts:
        return Refused(409, f"account {body.name} already exists")
    if body.parent is not None and body.parent not in accounts:
        return not_found(f"parent account {body.parent}")
    created = await publisher.publish(
        AccountCreated(account=body.name, parent=body.parent, description=body.description),
        principal=principal,
    )
    if isinstance(created, Refused):
        return created
    reason = await reads.voided_reason(created.seq)
    if reason is not None:  # created meanwhile by another request
        return Refused(409, reason)
    if body.shares != 1:
        shares = SharesSet(account=body.name, shares=body.shares)
        written = await publisher.publish(shares, principal=principal)
        if isinstance(written, Refused):
            return written
    return None


async def _change(
    publisher: Publisher,
    reads: Reads,
    name: str,
    principal: Principal,
    act: AccountAct,
    event: Callable[[], Event | Invalid],
) -> Refusal | None:
    """The command of every change of an account: it exists, the caller may `act` on
    it, and `event()` (made once both hold) is written. None once written."""
    refused = await _require(reads, name, principal) or denied(
        account_problem(principal, act, name, reads.accounts())
    )
    if refused is not None:
        return refused
    made = event()
    if isinstance(made, Invalid):
        return made
    written = await publisher.publish(made, principal=principal)
    return written if isinstance(written, Refused) else None


@router.get("", response_model=AccountList)
async def list_accounts(reads: ReadsDep, principal: PrincipalDep) -> AccountList:
    """Accounts created by admins, with their parent and shares."""
    await reads.catch_up(principal.name)
    accounts = answer(reads.policies.account_tree())
    return AccountList(accounts=[_view(a) for _, a in sorted(accounts.items())])


@router.post("", status_code=201, response_model=Account, responses={404: {}, 409: {}})
async def create_account(
    body: NewAccount, publisher: PublisherDep, reads: ReadsDep, principal: PrincipalDep
) -> Account:
    """Create an account under `parent` (events AccountCreated, SharesSet): operators,
    or coordinators of `parent`."""
    answer(await _create(publisher, reads, body, principal))
    return await _after_write(reads, body.name, principal)


@router.put("/{name}/shares", response_model=Account, responses={404: {}})
async def set_shares(
    name: AccountName,
    body: Shares,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
) -> Account:
    """Set the account's fair-share shares (event SharesSet): operators, or
    coordinators of its parent."""
    shares = partial(SharesSet, account=name, shares=body.shares)
    answer(await _change(publisher, reads, name, principal, "shares", shares))
    return await _after_write(reads, name, principal)


@router.put("/{name}/users", response_model=Account, responses={404: {}, 422: {}})
async def set_users(
    name: AccountName,
    body: Users,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
) -> Account:
    """Set who may submit under the account (event AccountUsersSet); [] lets anyone.
    Operators, or the account's coordinators."""

    def users() -> Event | Invalid:
        try:
            return AccountUsersSet(account=name, users=body.users)
        except ValidationError as exc:
            return Invalid(tuple({**err, "loc": ("body", *err["loc"])} for err in exc.errors()))

    answer(await _change(publisher, reads, name, principal, "members", users))
    return await _after_write(reads, name, principal)


@router.put("/{name}/quota", response_model=Account, responses={404: {}})
async def set_quota(
    name: AccountName,
    body: QuotaBody,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
) -> Account:
    """Set the account's quota of one resource, borrowing limit and cap (event QuotaSet):
    operators only."""
    quota = partial(
        QuotaSet,
        account=name,
        resource=body.resource,
        nominal=body.nominal,
        borrowing_limit=body.borrowing_limit,
        cap=body.cap,
    )
    answer(await _change(publisher, reads, name, principal, "quota", quota))
    return await _after_write(reads, name, principal)


@router.put("/{name}/coordinators", response_model=Account, responses={404: {}})
async def set_coordinators(
    name: AccountName,
    body: Coordinators,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
) -> Account:
    """Name who coordinates the account and its subtree (event AccountCoordinatorsSet):
    operators only; [] names none."""
    coordinators = partial(AccountCoordinatorsSet, account=name, coordinators=body.coordinators)
    answer(await _change(publisher, reads, name, principal, "coordinators", coordinators))
    return await _after_write(reads, name, principal)

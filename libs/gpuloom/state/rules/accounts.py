"""The fold's rules of accounts: created in the hierarchy, their shares, users,
coordinators and quotas."""

from __future__ import annotations

from gpuloom.events import (
    AccountCoordinatorsSet,
    AccountCreated,
    AccountUsersSet,
    QuotaSet,
    SharesSet,
)
from gpuloom.state.errors import Invalid
from gpuloom.state.model import ClusterState
from gpuloom.state.rules.common import Rule, rule
from gpuloom.state.step import Step
from gpuloom.state.tenancy import AccountState


def _account_created(state: ClusterState, event: AccountCreated, step: Step) -> None:
    if event.account in state.accounts:
        raise Invalid(f"account {event.account} already exists")
    if event.parent is not None and event.parent not in state.accounts:
        raise Invalid(f"parent account {event.parent} does not exist")
    state.accounts[event.account] = AccountState(
        event.account, event.parent, description=event.description
    )


def _shares_set(state: ClusterState, event: SharesSet, step: Step) -> None:
    account = state.accounts.get(event.account)
    if account is None:
        raise Invalid(f"account {event.account} does not exist")
    account.shares = event.shares


def _users_set(state: ClusterState, event: AccountUsersSet, step: Step) -> None:
    account = state.accounts.get(event.account)
    if account is None:
        raise Invalid(f"account {event.account} does not exist")
    account.users = tuple(event.users)


def _coordinators_set(state: ClusterState, event: AccountCoordinatorsSet, step: Step) -> None:
    account = state.accounts.get(event.account)
    if account is None:
        raise Invalid(f"account {event.account} does not exist")
    account.coordinators = tuple(event.coordinators)


def _quota_set(state: ClusterState, event: QuotaSet, step: Step) -> None:
    account = state.accounts.get(event.account)
    if account is None:
        raise Invalid(f"account {event.account} does not exist")
    if event.nominal is None:
        account.quotas.pop(event.resource, None)
    else:
        account.quotas[event.resource] = (event.nominal, event.borrowing_limit, event.cap)


RULES: tuple[Rule, ...] = (
    rule(AccountCreated, _account_created),
    rule(SharesSet, _shares_set),
    rule(AccountUsersSet, _users_set),
    rule(AccountCoordinatorsSet, _coordinators_set),
    rule(QuotaSet, _quota_set),
)

"""What a principal may do: the authorization matrix, as pure functions.

Each function takes the principal, the act and the facts it needs (a job's user and
account, the account tree with its members and coordinators) and returns None when
the act is allowed, else the reason it is not (the gateway answers 403 with it).
No I/O, no clock: the gateway reads the facts from its projection and translates.

Three kinds of principal (docs/security.md has the matrix):
- a **user** (any valid token) submits under accounts they are a member of, as
  themselves; sees the queue, the nodes and every job, but another user's command
  and environment are hidden; cancels their own jobs, reads their logs, events
  and usage;
- a **coordinator** of an account (named in the log by AccountCoordinatorsSet,
  not a token role, as in Slurm) does, for that account and every account below
  it: set members, create sub-accounts, set the shares of sub-accounts, cancel
  jobs, read their details, logs, events and usage;
- an **operator** (token role `operator`) may do everything, and submit for
  another user (the log then records both names), define priority classes and
  limits, and give a job a priority over its class's.

Which priority class a user may use is the class's own list (`gpuloom.queueing.classes`,
which admission asks too); the priority within it is `priority_problem`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

from gpuloom.auth.tokens import Principal
from gpuloom.state.tenancy import AccountState, membership_problem

Accounts = Mapping[str, AccountState]

#: What may be done to one job, by its user, its account's coordinators and operators.
JobAct = Literal["details", "cancel", "logs", "events"]
#: What may be done to one account.
AccountAct = Literal["create", "members", "shares", "quota", "coordinators"]

_JOB_VERBS: dict[str, str] = {
    "details": "see the command and environment of",
    "cancel": "cancel",
    "logs": "read the logs of",
    "events": "read the events of",
}


def ancestry(account: str, accounts: Accounts) -> Iterator[str]:
    """`account`, its parent, its parent's parent... up to a root (or an unknown name).

    Bounded by the number of accounts: the fold refuses a parent that does not
    exist yet, so the tree has no cycle, but a policy must not loop on bad facts.
    """
    seen: set[str] = set()
    current: str | None = account
    while current is not None and current not in seen and len(seen) <= len(accounts):
        seen.add(current)
        yield current
        known = accounts.get(current)
        current = known.parent if known is not None else None


def coordinates(principal: Principal, account: str, accounts: Accounts) -> bool:
    """Whether `principal` coordinates `account` or an account above it."""
    return any(
        principal.name in accounts[name].coordinators
        for name in ancestry(account, accounts)
        if name in accounts
    )


def coordinated(principal: Principal, accounts: Accounts) -> frozenset[str]:
    """Every account `principal` coordinates, directly or below one it coordinates."""
    return frozenset(name for name in accounts if coordinates(principal, name, accounts))


def operator_only(principal: Principal, what: str) -> str | None:
    """Acts on the cluster itself (nodes, pools, quotas, coordinators, dead letters,
    projections): operators only."""
    if principal.operator:
        return None
    return f"{principal.name} may not {what}: it needs the operator role"


def submit_problem(principal: Principal, user: str, account: str, accounts: Accounts) -> str | None:
    """Why `principal` may not submit a job of `user` under `account`, if so.

    A user submits as themselves only; an operator may submit for anyone (a job
    for a non-member is then written, and rejected by admission, on the record).
    """
    if principal.operator:
        return None
    if user != principal.name:
        return (
            f"{principal.name} may not submit as {user}: only an operator may submit for "
            "another user"
        )
    return membership_problem(user, account, accounts)


def job_problem(
    principal: Principal, act: JobAct, job_user: str, job_account: str, accounts: Accounts
) -> str | None:
    """Why `principal` may not `act` on a job of `job_user` under `job_account`, if so."""
    if (
        principal.operator
        or principal.name == job_user
        or coordinates(principal, job_account, accounts)
    ):
        return None
    return (
        f"{principal.name} may not {_JOB_VERBS[act]} a job of {job_user}: only its user, "
        f"a coordinator of account {job_account} or an operator may"
    )


def account_problem(
    principal: Principal,
    act: AccountAct,
    account: str,
    accounts: Accounts,
    parent: str | None = None,
) -> str | None:
    """Why `principal` may not `act` on `account`, if so.

    - create: an operator, or (for a sub-account) a coordinator of `parent`;
    - members: a coordinator of the account (or above);
    - shares: a coordinator of its parent (or above): shares divide the parent's
      entitlement among siblings, so an account's own coordinator may not raise it;
    - quota, coordinators: operators only.
    """
    if principal.operator:
        return None
    if act == "create":
        if parent is not None and coordinates(principal, parent, accounts):
            return None
        if parent is None:
            return (
                f"{principal.name} may not create a top-level account: it needs the operator role"
            )
        return (
            f"{principal.name} may not create an account under {parent}: only its "
            "coordinators or an operator may"
        )
    if act == "members":
        if coordinates(principal, account, accounts):
            return None
        return (
            f"{principal.name} may not set the members of account {account}: only its "
            "coordinators or an operator may"
        )
    if act == "shares":
        known = accounts.get(account)
        above = known.parent if known is not None else None
        if above is not None and coordinates(principal, above, accounts):
            return None
        return (
            f"{principal.name} may not set the shares of account {account}: only a "
            "coordinator of its parent or an operator may"
        )
    what = "set quotas" if act == "quota" else "name coordinators"
    return operator_only(principal, f"{what} of account {account}")


@dataclass(frozen=True, slots=True)
class Scope:
    """Which usage rows and job records a principal may read: their own (`user`) and
    those of the accounts they coordinate. None in place of a Scope: everything."""

    user: str
    accounts: frozenset[str]

    def covers(self, user: str, account: str) -> bool:
        return user == self.user or account in self.accounts


def usage_scope(principal: Principal, accounts: Accounts) -> Scope | None:
    """The usage `principal` may read: None (all) for an operator."""
    if principal.operator:
        return None
    return Scope(user=principal.name, accounts=coordinated(principal, accounts))


def priority_problem(
    principal: Principal, priority: int, class_name: str, class_priority: int
) -> str | None:
    """Why `principal` may not ask `priority` in a class whose priority is
    `class_priority`, if so: above it only an operator may (the gateway logs it)."""
    if priority <= class_priority or principal.operator:
        return None
    return (
        f"priority {priority} is over the maximum of priority class {class_name} "
        f"({class_priority}); only an operator may set it higher"
    )

"""Who a job runs as, and the working directory it gets (docs/operations.md, "Who jobs run as").

A job never runs as root. An agent running as root starts each job as an
unprivileged account: the configured `agent_job_user` ("nobody" by default),
or, with `agent_map_users`, the submitting user's own local account where one
of that name exists (as Slurm does). An agent that is not root cannot switch
users: its jobs run as its own user.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path

#: The account jobs run as when the agent is root and none is configured.
DEFAULT_JOB_USER = "nobody"


class AccountError(Exception):
    """The account jobs should run as cannot be used (missing, or root)."""


@dataclass(frozen=True, slots=True)
class Account:
    """A local account: what a job's process is switched to."""

    name: str
    uid: int
    gid: int
    #: Supplementary groups (the account's own, never root's group).
    groups: tuple[int, ...] = ()


def resolve_account(name: str) -> Account:
    """The local account `name` from the passwd and group databases.

    Raises AccountError if no such account exists, or if it is root's (uid or
    primary group 0): jobs never run with root's rights.
    """
    try:
        entry = pwd.getpwnam(name)
    except (KeyError, ValueError) as exc:  # ValueError: a name with a NUL
        raise AccountError(f"no local account named {name!r}") from exc
    if entry.pw_uid == 0 or entry.pw_gid == 0:
        raise AccountError(f"account {name!r} is root's (uid or gid 0): jobs never run as root")
    groups = sorted(set(os.getgrouplist(name, entry.pw_gid)) - {0})
    return Account(name, entry.pw_uid, entry.pw_gid, tuple(groups))


def own_account() -> Account:
    """The agent's own user (named by its uid when the passwd database lacks it)."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return Account(name, uid, gid)


class Accounts:
    """Chooses the account each job runs as."""

    def __init__(self, default: Account, *, map_users: bool = False, ignored: bool = False) -> None:
        self.default = default
        #: Whether processes can be switched to other users (the agent is root).
        self.can_switch = os.geteuid() == 0
        self.map_users = map_users and self.can_switch
        #: Whether settings asked for a switch this agent (not root) cannot make.
        self.ignored = ignored

    def for_user(self, user: str) -> Account:
        """The account a job submitted by `user` runs as (never root)."""
        if self.map_users:
            try:
                return resolve_account(user)
            except AccountError:
                pass  # no such local user (or root's): the default account
        return self.default

    def describe(self) -> str:
        """Who jobs run as, for the agent's start-up log."""
        who = f"{self.default.name} (uid {self.default.uid})"
        if not self.can_switch:
            note = ": agent_job_user and agent_map_users are ignored" if self.ignored else ""
            return f"jobs run as the agent's own user {who}: it is not root, it cannot switch{note}"
        mapped = ", or as their submitting user's local account" if self.map_users else ""
        return f"jobs run as {who}{mapped}"


def job_accounts(job_user: str | None = None, map_users: bool = False) -> Accounts:
    """The agent's choice of accounts, from its settings; made once, at start.

    Raises AccountError when the agent is root and the account it would run jobs
    as does not exist or is root's. An agent that is not root runs every job as
    itself (`describe` says so).
    """
    if os.geteuid() != 0:
        return Accounts(own_account(), ignored=bool(job_user) or map_users)
    return Accounts(resolve_account(job_user or DEFAULT_JOB_USER), map_users=map_users)


def prepare_workdir(path: Path, account: Account) -> None:
    """Create the job's own working directory, owned by `account`, mode 0700."""
    path.mkdir(mode=0o700, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, account.uid, account.gid)
    os.chmod(path, 0o700)

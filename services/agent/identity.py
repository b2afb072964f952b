"""Who a job runs as, and the working directory it gets (docs/operations.md, "Who jobs run as").

A job never runs as root. An agent running as root starts each user's jobs under
a uid of that user's own: with `agent_map_users`, the submitting user's local
account where one of that name exists (as Slurm does), else a uid given to the
user from `agent_job_uid_range` (`services.agent.uids`), never shared with
another user. A configured `agent_job_user` instead runs every job as that one
account (the old behaviour: users are then not kept apart). An agent that is not
root cannot switch users: its jobs run as its own user.
"""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from pathlib import Path

from services.agent.uids import DEFAULT_UID_RANGE, UidMap


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
    """Chooses the account each job runs as: the user's local account (mapped), else
    the user's own uid from `uids`, else the one `default` account."""

    def __init__(
        self,
        default: Account,
        *,
        map_users: bool = False,
        ignored: bool = False,
        uids: UidMap | None = None,
    ) -> None:
        self.default = default
        #: Whether processes can be switched to other users (the agent is root).
        self.can_switch = os.geteuid() == 0
        self.map_users = map_users and self.can_switch
        #: Whether settings asked for a switch this agent (not root) cannot make.
        self.ignored = ignored
        #: Each user's own uid (None: every unmapped job runs as `default`).
        self.uids = uids if self.can_switch else None

    def for_user(self, user: str) -> Account:
        """The account a job submitted by `user` runs as (never root). Raises
        UidError when the user has no uid and none can be given."""
        if self.map_users:
            try:
                return resolve_account(user)
            except AccountError:
                pass  # no such local user (or root's): the user's own uid
        if self.uids is not None:
            uid = self.uids.uid(user)
            return Account(user, uid, uid)
        return self.default

    def describe(self) -> str:
        """Who jobs run as, for the agent's start-up log."""
        who = f"{self.default.name} (uid {self.default.uid})"
        if not self.can_switch:
            note = ": agent_job_user and agent_map_users are ignored" if self.ignored else ""
            return f"jobs run as the agent's own user {who}: it is not root, it cannot switch{note}"
        mapped = "as their submitting user's local account where one exists, else " * (
            self.map_users
        )
        if self.uids is not None:
            span = self.uids.span
            return (
                f"jobs run {mapped}as a uid of their user's own from {span.start}-"
                f"{span.stop - 1} (kept in {self.uids.path})"
            )
        return (
            f"jobs run {mapped}as {who}: jobs of different users share it and are not "
            "isolated from each other (unset agent_job_user for a uid per user)"
        )


def job_accounts(
    job_user: str | None = None,
    map_users: bool = False,
    uid_file: Path | None = None,
    uid_range: range = DEFAULT_UID_RANGE,
) -> Accounts:
    """The agent's choice of accounts, from its settings; made once, at start.

    A root agent runs each user's jobs as that user's own uid, kept in `uid_file`
    (or, with `job_user`, every job as that account). Raises AccountError when the
    agent is root and `job_user` does not exist or is root's, or when neither
    `job_user` nor `uid_file` is given. An agent that is not root runs every job
    as itself (`describe` says so).
    """
    if os.geteuid() != 0:
        return Accounts(own_account(), ignored=bool(job_user) or map_users)
    if job_user:
        return Accounts(resolve_account(job_user), map_users=map_users)
    if uid_file is None:
        raise AccountError("a root agent needs a file to keep each user's uid in")
    return Accounts(own_account(), map_users=map_users, uids=UidMap(uid_file, uid_range))


def prepare_workdir(path: Path, account: Account) -> None:
    """Create the job's own working directory, owned by `account`, mode 0700."""
    path.mkdir(mode=0o700, exist_ok=True)
    if os.geteuid() == 0:
        os.chown(path, account.uid, account.gid)
    os.chmod(path, 0o700)

"""What operators and coordinators set for the tenants, as folded: accounts, priority
classes, limits, webhooks and advance reservations. `ClusterState` holds them by name; the queue, the
gateway's checks and the webhooks read them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime


@dataclass
class AccountState:
    name: str
    parent: str | None
    shares: int = 1
    description: str = ""
    #: Who may submit under it (AccountUsersSet); empty: anyone.
    users: tuple[str, ...] = ()
    #: Who coordinates it and its sub-accounts (AccountCoordinatorsSet), sorted.
    coordinators: tuple[str, ...] = ()
    #: Quotas (QuotaSet) by resource kind: (nominal, borrowing limit, cap).
    quotas: dict[str, tuple[int, int | None, int | None]] = field(default_factory=dict)

    @property
    def nominal(self) -> int | None:
        """The nominal quota of all GPU time (milli-GPU), if set."""
        quota = self.quotas.get("gpu_milli")
        return quota[0] if quota is not None else None


@dataclass(frozen=True)
class PriorityClass:
    """An operator's priority class (PriorityClassSet), as folded."""

    name: str
    priority: int
    may_preempt: bool = True
    #: Who may use it: a listed user, or a job under a listed account; both empty: anyone.
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    description: str = ""
    #: The class of a submission that names none (at most one class has it).
    default: bool = False


#: The key of the whole cluster's count and limits beside ("user", u) and ("account", a).
CLUSTER_TOTAL = ("cluster", "all")


@dataclass(frozen=True)
class IdentityLimits:
    """One user's or account's limits (LimitsSet); None: unlimited."""

    max_submit_jobs: int | None = None
    max_array_size: int | None = None
    #: GPUs held, a fraction counting as its share (compared in milli-GPU).
    max_gpus: int | None = None


@dataclass(frozen=True)
class Webhook:
    """A webhook as folded (WebhookRegistered; WebhookDisabled sets `disabled`)."""

    webhook_id: str
    owner: str
    operator: bool
    url: str
    types: tuple[str, ...]
    job: str | None
    user: str | None
    account: str | None
    node: str | None
    secret_sealed: str
    description: str
    #: The sequence of its registration: it gets the events after it.
    registered_seq: int
    registered_at: datetime
    #: Why deliveries stopped (WebhookDisabled), or None.
    disabled: str | None = None
    #: When its operator powers end (the registering or renewing token's `exp`);
    #: None: they do not (`operator` says whether it has them at all).
    operator_until: datetime | None = None


def is_member(user: str, account: str, accounts: Mapping[str, AccountState]) -> bool:
    """Whether `user` may submit under `account` (its AccountUsersSet): an account
    nobody created, or one without a member list, takes anyone. The gateway asks it
    before it writes a submission, admission again of each one in the log."""
    known = accounts.get(account)
    return known is None or not known.users or user in known.users


def membership_problem(user: str, account: str, accounts: Mapping[str, AccountState]) -> str | None:
    """Why `user` may not submit under `account`, if so (`is_member`)."""
    if is_member(user, account, accounts):
        return None
    return f"user {user} may not submit under account {account}"


@dataclass(frozen=True)
class AdvanceReservation:
    """An operator's advance reservation (ReservationCreated, ReservationUpdated), as
    folded (docs/reservations.md). Not the EASY backfill reservation of one blocked job
    (`ClusterState.reservation`): this one is made by an operator, for a window."""

    name: str
    start: datetime
    end: datetime
    #: (node, GPU index), sorted.
    gpus: tuple[tuple[str, int], ...]
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    #: A maintenance window: no job may use it.
    maint: bool = False
    #: Made although running jobs may still hold its GPUs at its start.
    ignore_jobs: bool = False
    description: str = ""
    #: Its start was reached (ReservationStarted, written by placement at that time):
    #: its jobs may run, and no other job may use its GPUs until it ends.
    started: bool = False

    def lets_in(self, user: str, account: str) -> bool:
        """Whether a job of `user` under `account` may run in it (never in a `maint` one)."""
        return not self.maint and (user in self.users or account in self.accounts)

    def overlaps(self, start: datetime, end: datetime) -> bool:
        return self.start < end and start < self.end

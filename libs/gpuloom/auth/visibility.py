"""Who sees which event of the log: the rule of `GET /v1/events` and of webhooks, one
implementation for both (the gateway's streams, the webhooks process's outbox).

An operator sees every event; a user the events of the jobs they may read the events
of (their own, and those of accounts they coordinate), of the accounts they belong to
or coordinate, and of the cluster (nodes, pools, queue policy, priority classes,
limits, advance reservations); audits and webhooks are for operators. Pure: the owners of jobs come from a
fold and, for a job the fold forgot, from a lookup the caller gives.

One implementation for every reader: the event stream (`visible`, `needs_owner`), the
webhooks (`gpuloom.webhooks.policy.gets`) and the REST read of a job's events
(`job_events_problem`, `GET /v1/jobs/{id}/events`).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from gpuloom.auth.policy import Accounts, coordinates, job_problem
from gpuloom.auth.tokens import Principal
from gpuloom.events import Event, JobArraySubmitted, JobEvent, JobSubmitted
from gpuloom.state import ClusterState
from gpuloom.state.retention import owner
from gpuloom.state.tenancy import is_member

#: Aggregates only operators see: audits, and webhooks (whose URLs are their owners').
OPERATORS_ONLY = frozenset({"audit", "webhook"})
#: Owners of jobs one `Owners` remembers (learned from submissions it passed).
OWNERS_KEPT = 10_000

Owner = tuple[str, str]
#: The (user, account) of a job the fold no longer knows (the gateway's read model).
LookupOwner = Callable[[str], Awaitable[Owner | None]]


@dataclass(frozen=True, slots=True)
class StreamFilter:
    """What a client asked for; empty fields ask for everything."""

    types: frozenset[str] = frozenset()
    job: str | None = None
    user: str | None = None
    account: str | None = None
    node: str | None = None

    def wants(self, event: Event, job_owner: Owner | None) -> bool:
        if self.types and event.TYPE not in self.types:
            return False
        if self.job is not None and not _about_job(event, self.job):
            return False
        if self.node is not None and getattr(event, "node", None) != self.node:
            return False
        user, account = job_owner if job_owner is not None else (None, None)
        if event.AGGREGATE == "account":
            account = event.aggregate_id()
        if self.user is not None and user != self.user:
            return False
        return self.account is None or account == self.account


def _about_job(event: Event, job_id: str) -> bool:
    """The job's own events (an array's id: the array's own, its submission and
    cancellation)."""
    return isinstance(event, JobEvent) and event.job_id == job_id


def job_events_problem(
    principal: Principal, job_owner: Owner | None, accounts: Accounts
) -> str | None:
    """Why `principal` may not see the events of a job owned by `job_owner` (user,
    account), if so: those of a job whose owner is unknown (never submitted, voided,
    not folded yet) only an operator sees."""
    if job_owner is None:
        return None if principal.operator else "only an operator sees a job whose owner is unknown"
    return job_problem(principal, "events", job_owner[0], job_owner[1], accounts)


def visible(
    principal: Principal, event: Event, job_owner: Owner | None, accounts: Accounts
) -> bool:
    """Whether `principal` may see `event` (see the module doc)."""
    if principal.operator:
        return True
    if isinstance(event, JobEvent):
        return job_events_problem(principal, job_owner, accounts) is None
    if event.AGGREGATE == "account":
        account = event.aggregate_id()
        return is_member(principal.name, account, accounts) or coordinates(
            principal, account, accounts
        )
    return event.AGGREGATE not in OPERATORS_ONLY


def needs_owner(principal: Principal, wanted: StreamFilter) -> bool:
    """Whether deciding `visible` and `wanted.wants` for `principal` needs the owner of
    a job's events: an operator sees every event, so only a filter by user or account
    asks (a reader skips the lookup otherwise)."""
    return not principal.operator or wanted.user is not None or wanted.account is not None


_SUBMISSIONS = (JobSubmitted, JobArraySubmitted)


class Owners:
    """Who owns each job a reader of the log passes: from the submissions it saw, the
    fold, then `lookup` (an ended job the fold forgot); bounded."""

    def __init__(self, state: Callable[[], ClusterState], lookup: LookupOwner) -> None:
        self.state = state
        self.lookup = lookup
        self._known: OrderedDict[str, Owner | None] = OrderedDict()

    def learn(self, event: Event) -> None:
        if isinstance(event, _SUBMISSIONS):
            self._remember(event.job_id, (event.spec.user, event.spec.account))

    async def of(self, event: Event) -> Owner | None:
        if not isinstance(event, JobEvent):
            return None
        job_id = event.job_id
        if job_id in self._known:
            self._known.move_to_end(job_id)
            return self._known[job_id]
        state = self.state()
        found = owner(state, job_id)
        if found is None and job_id in state.arrays:  # an array's own id
            found = owner(state, f"{job_id}-0")
        if found is None:
            found = await self.lookup(job_id)
        self._remember(job_id, found)
        return found

    def _remember(self, job_id: str, found: Owner | None) -> None:
        self._known[job_id] = found
        self._known.move_to_end(job_id)
        while len(self._known) > OWNERS_KEPT:
            self._known.popitem(last=False)

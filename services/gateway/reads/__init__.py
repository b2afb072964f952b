"""The gateway's read facade: the one way to the SQL rows the read-model writer keeps
and to the gateway's own fold of the log (`services.gateway.readmodel`).

Routes and commands read through `Reads` (the dependency `deps.ReadsDep`), one typed
method per question, by resource: `jobs`, `cluster`, `usage`, `policies`,
`reservations`, `submissions`, `webhooks`, `events`, `progress`, `gauges`. No module of
the gateway outside this package imports SQLAlchemy or `gpuloom.store`, nor reads the
read model (the `reads-behind-the-facade` contract in pyproject.toml, and
tests/unit/gateway/test_read_facade.py)."""

from __future__ import annotations

from gpuloom.auth.policy import Accounts
from services.gateway.parts import Gateway
from services.gateway.reads.cluster import ClusterReads
from services.gateway.reads.events import EventReads
from services.gateway.reads.gauges import GaugeReads
from services.gateway.reads.jobs import JobReads
from services.gateway.reads.policies import PolicyReads
from services.gateway.reads.progress import ProgressReads
from services.gateway.reads.reservations import ReservationReads
from services.gateway.reads.source import Source
from services.gateway.reads.submissions import SubmissionReads
from services.gateway.reads.usage import UsageReads
from services.gateway.reads.webhooks import WebhookReads

__all__ = ["Reads"]


class Reads:
    """What one gateway's requests read, at the moment they read it."""

    __slots__ = (
        "_source",
        "cluster",
        "events",
        "gauges",
        "jobs",
        "policies",
        "progress",
        "reservations",
        "submissions",
        "usage",
        "webhooks",
    )

    def __init__(self, gateway: Gateway) -> None:
        source = self._source = Source(gateway)
        self.jobs = JobReads(source)
        self.cluster = ClusterReads(source)
        self.usage = UsageReads(source)
        self.policies = PolicyReads(source)
        self.reservations = ReservationReads(source)
        self.submissions = SubmissionReads(source)
        self.webhooks = WebhookReads(source)
        self.events = EventReads(source)
        self.progress = ProgressReads(source)
        self.gauges = GaugeReads(source)

    async def catch_up(self, caller: str) -> bool:
        """Wait (bounded) until the rows and the fold include `caller`'s own writes
        through this gateway, never anyone else's; False: the wait ran out."""
        return await self._source.catch_up(caller)

    async def fold_own_writes(self) -> None:
        """Wait (bounded) until the fold includes every write of this gateway, anyone's."""
        await self._source.fold_own_writes()

    async def voided_reason(self, seq: int) -> str | None:
        """Why the log voided the event at `seq`, once the fold has it; None: applied."""
        return await self._source.voided_reason(seq)

    def accounts(self) -> Accounts:
        """The account tree as folded (empty before the gateway read the log): what the
        authorization policy (`gpuloom.auth.policy`) decides who may see and do what on."""
        return self._source.accounts()

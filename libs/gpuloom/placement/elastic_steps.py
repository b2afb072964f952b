"""The steps of a scheduling pass for elastic gangs (`placement.elastic`): the replicas
a gang takes beyond its minimum when it starts, and the growth of the running ones at
the end of a pass. A part of `SchedulingPass` (a mixin), apart so that the pass reads
as its walk over the queue."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from gpuloom.placement.candidate import Candidate
from gpuloom.placement.elastic import (
    Grown,
    Growth,
    gang_domain,
    more_replicas,
    one_more,
    per_replica,
    scaled,
)
from gpuloom.placement.engine import Context, NodeIndex, Policy
from gpuloom.placement.outcomes import Outcome
from gpuloom.placement.quota_fit import Where, where_demand, where_limited, within_quota
from gpuloom.placement.resources import Placement, ReplicaPlacement, Request
from gpuloom.queueing.quota import QuotaBook


class ElasticSteps:
    """What `SchedulingPass` does for elastic gangs; it reads the pass's fields."""

    index: NodeIndex
    policy: Policy
    quotas: QuotaBook | None
    outcomes: list[Outcome]
    position: int
    placed: int
    blocked: bool
    _where: Where | None
    _until: set[str] | None
    _growable: Callable[[], Sequence[Growth]] | None

    context: Context
    #: The most placements in one pass (`Rules.limit`).
    _limit: int

    def _decision(self, position: int) -> Context:
        """What a decision at `position` of this pass may depend on: made only for the
        candidates that get that far (most of a long queue is skipped before)."""
        return Context(self.context.seed, position, self.context.workload)

    def _with_extra(
        self, candidate: Candidate, placement: Placement | None, decision: Context
    ) -> Placement | None:
        """An elastic gang placed at its minimum, with the replicas it may take beyond
        that fit now and within its quotas: none while a job ahead of it is blocked
        (what it would take beyond is that job's to have first)."""
        if placement is None or not candidate.extra or self.blocked:
            return placement
        request = candidate.request
        unit = per_replica(candidate.demand, request.replicas)
        base = placement.replicas

        def fits_quota(extra: Sequence[ReplicaPlacement]) -> bool:
            return self._quota_room(candidate.account, candidate.user, unit, [*base, *extra])

        domain = gang_domain(request, self.index, base[0].host)
        added, _ = more_replicas(
            one_more(request, domain), candidate.extra, self.index, self.policy, decision,
            fits_quota,
        )  # fmt: skip
        return Placement((*base, *added)) if added else placement

    def _quota_room(
        self, account: str, user: str, unit: Mapping[str, int], replicas: list[ReplicaPlacement]
    ) -> bool:
        """Whether the quotas let `account` (and `user`) take `replicas` more, of which each
        takes `unit` (a growth: a job's start is paced, not its replicas)."""
        if self.quotas is None:
            return True
        demand = {
            **scaled(unit, len(replicas)),
            **where_demand(self.index, Placement(tuple(replicas))),
        }
        return self.quotas.why_not(account, demand, user or None, pacing=False) is None

    def _grow(self) -> None:
        """At the end of a pass that blocked no job: the running elastic gangs take more
        replicas where they fit, in their order, each within its quotas (a `Grown`), on
        the GPU models and pools those admit. A replica's ask that found no room finds
        none for a later gang either (a pass only takes)."""
        if self.blocked or self._growable is None or self._until is not None:
            return
        full: set[Request] = set()
        for growth in self._growable():
            if self.placed >= self._limit:
                return
            request = self._admitted_growth(growth)
            if request is None or request in full:
                continue

            def fits_quota(extra: Sequence[ReplicaPlacement], growth: Growth = growth) -> bool:
                return self._quota_room(growth.account, growth.user, growth.unit, list(extra))

            decision = self._decision(self.position)
            added, no_room = more_replicas(
                request, growth.missing, self.index, self.policy, decision, fits_quota
            )
            if no_room:
                full.add(request)
            if not added:
                continue
            if self.quotas is not None:
                taken = Placement(tuple(added))
                demand = {**scaled(growth.unit, len(added)), **where_demand(self.index, taken)}
                self.quotas.hold(growth.account, demand, growth.user or None)
            self.outcomes.append(Grown(growth.job_id, tuple(added), growth.first, self.position))
            self.position += 1
            self.placed += 1

    def _admitted_growth(self, growth: Growth) -> Request | None:
        """One more replica's ask, narrowed to the GPU models and pools the gang's quotas
        admit (`within_quota`, as a pending job's); None when none is."""
        quotas = self.quotas
        if quotas is None:
            return growth.request
        if self._where is None:
            self._where = where_limited(self.index, quotas)
        if not self._where:
            return growth.request
        asking = Candidate(
            growth.job_id, growth.request, account=growth.account, demand=growth.unit,
            user=growth.user,
        )  # fmt: skip
        narrowed = within_quota(asking, quotas, self._where)
        return None if isinstance(narrowed, str) else narrowed.request

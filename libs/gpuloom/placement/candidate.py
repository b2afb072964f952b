"""A pending job as the scheduling pass sees it: what it asks, for whom, how urgent.

Its own module because the pass (`scheduling`), its quota checks (`quota_fit`), its
reservations (`reservation`) and the inputs built from the fold (`inputs`) all take
it, and none of them should import another only for this type.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from gpuloom.events.accounts import GPU_MILLI
from gpuloom.placement.resources import Request


@dataclass(frozen=True, slots=True)
class Candidate:
    """A pending job as the scheduler sees it."""

    job_id: str
    request: Request
    time_limit_s: int | None = None
    priority_class: int = 0
    account: str = ""
    #: What the job takes of the quota resources known before placement
    #: (`gpu_milli`, `gpus`); its model and pool ones follow from where it lands.
    demand: Mapping[str, int] = field(default_factory=dict)
    preemptible: bool = False
    #: Jobs were already stopped for it and have not ended yet: it preempts no more.
    awaiting_victims: bool = False
    #: Its user, for the per-identity GPU maxima ("": none checked).
    user: str = ""
    #: Its priority class lets it preempt (`PriorityClassSet.may_preempt`); a job
    #: whose class may not never stops another, for priority or to reclaim quota.
    may_preempt: bool = True
    #: The advance reservation it runs in (`placement.fences`); None: none.
    reservation: str | None = None
    #: An elastic gang: the replicas it may take beyond `request.replicas` (its
    #: minimum) when it starts (`placement.elastic`).
    extra: int = 0

    @property
    def demand_milli(self) -> int:
        return self.demand.get(GPU_MILLI, 0)

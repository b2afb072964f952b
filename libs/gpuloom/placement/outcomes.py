"""What one scheduling pass says about each job it meets: placed, preempting for it,
reserved, or waiting with the reason.

The pass (`gpuloom.placement.scheduling`) returns these in the order it decided them.
The placement cycle writes the first three as events; `Waiting` is written nowhere: it
is what `gpuloom explain` and the API's pending reasons read, so that the reason a job
waits is the scheduler's own, never a second model of it.

Reason codes (Slurm's where one exists):

- `QuotaExceeded`: its account's quota (with what it may borrow) has no room, or no GPU
  model or pool it may use has;
- `AssocGrpGRES`: its user or account holds as many GPUs as its `max_gpus` allows;
- `Resources`: no node has room for it now (the blocked job, or one behind it that
  does not fit either);
- `Reservation`: a node has room now, but it would run past the start of the job that
  holds the reservation, on what that job reserved; or the room is an advance
  reservation's (it would run past its start, or it has started), or the job is of an
  advance reservation that has not started (docs/reservations.md);
- `ReqNodeNotAvail`: the room it would have is held by a maintenance reservation;
- `Topology`: it must be inside one domain of a topology level, and no domain has room
  for all of it now (the detail says what each domain has);
- `Priority`: jobs ahead come first: the pass stopped before it (backfill off, or its
  depth or limit reached).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from gpuloom.placement.candidate import Candidate
from gpuloom.placement.elastic import Grown
from gpuloom.placement.holdings import Holding
from gpuloom.placement.reservation import Reservation
from gpuloom.placement.resources import Placement

PreemptReason = Literal["priority", "reclaim"]
WaitCode = Literal[
    "QuotaExceeded",
    "AssocGrpGRES",
    "StartPacing",
    "Resources",
    "Topology",
    "Reservation",
    "ReqNodeNotAvail",
    "Priority",
]


@dataclass(frozen=True, slots=True)
class Placed:
    candidate: Candidate
    placement: Placement
    #: Started while a job ahead of it in the queue could not start.
    backfilled: bool
    position: int


@dataclass(frozen=True, slots=True)
class Reserved:
    reservation: Reservation
    position: int


@dataclass(frozen=True, slots=True)
class Preempted:
    """`candidate` stops `victims` (positions `position`, `position + 1`, ...): a victim
    that is a `shrink` stops only those replicas of an elastic gang (JobShrunk)."""

    candidate: Candidate
    victims: tuple[Holding, ...]
    reason: PreemptReason
    position: int


@dataclass(frozen=True, slots=True)
class Waiting:
    """The pass met `job_id` and did not place it (or stopped before it): why."""

    job_id: str
    code: WaitCode
    detail: str


#: What the placement cycle writes.
Decided = Placed | Reserved | Preempted | Grown
Outcome = Placed | Reserved | Preempted | Grown | Waiting


def wait_code(refusal: str) -> WaitCode:
    """The code of a quota's refusal (`QuotaBook.why_not`: "QuotaExceeded: ...",
    "AssocGrpGRES: ..." or "StartPacing: ...")."""
    if refusal.startswith("AssocGrpGRES"):
        return "AssocGrpGRES"
    if refusal.startswith("StartPacing"):
        return "StartPacing"
    return "QuotaExceeded"

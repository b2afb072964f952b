"""/v1/reservations: advance reservations (Slurm's `scontrol create reservation`), GPUs
held for a window of time for some users or accounts, or for maintenance
(docs/reservations.md).

Reservations are facts of the cluster, as priority classes are: every authenticated
user reads all of them (who may use one, and when its GPUs are taken, is what a user
needs to know to plan a job). Only operators make, change and delete them (events
ReservationCreated, ReservationUpdated, ReservationDeleted). The gateway chooses the
GPUs on the state it folded (`reads.reservations.plan`) and refuses what the fold
would void (409: another reservation on them, running jobs that will still hold them
at the start, named, unless `ignore_jobs`); a write the log voids all the same (a
race) is answered 409 with the fold's reason. Each write answers the reservation as the
log has it once the gateway folded the write.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Response

from gpuloom.auth import Principal
from gpuloom.events import Event, ReservationCreated, ReservationDeleted, ReservationUpdated
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.state.tenancy import AdvanceReservation
from services.gateway.auth import PrincipalDep, operator
from services.gateway.cluster.reservation_bodies import (
    NewReservation,
    ReservationChange,
    ReservationList,
    ReservationView,
    changed_wanted,
    new_wanted,
    view,
)
from services.gateway.deps import PublisherDep, ReadsDep
from services.gateway.publish import Publisher
from services.gateway.reads import Reads
from services.gateway.reads.reservations import Wanted
from services.gateway.refusals import Invalid, Refusal, Refused, answer, not_found
from services.gateway.schemas import Problem

router = APIRouter(prefix="/v1/reservations", tags=["reservations"])

ReservationName = Annotated[
    str, Path(pattern=SUBJECT_TOKEN.pattern, description="a reservation's name")
]
WRITE_ERRORS: dict[int | str, dict[str, Any]] = {
    403: {"model": Problem, "description": "not an operator"},
    409: {
        "model": Problem,
        "description": "the name exists, too few GPUs are free for the window, or running "
        "jobs (named) will still hold them at its start",
    },
}


@router.get("", response_model=ReservationList)
async def list_reservations(reads: ReadsDep, principal: PrincipalDep) -> ReservationList:
    """Every reservation that has not ended, by name: any authenticated user."""
    await reads.catch_up(principal.name)
    return ReservationList(reservations=[view(r) for r in answer(reads.reservations.book())])


@router.get("/{name}", response_model=ReservationView)
async def get_reservation(
    name: ReservationName, reads: ReadsDep, principal: PrincipalDep
) -> ReservationView:
    """One reservation (404: none of that name, or it ended): any authenticated user."""
    await reads.catch_up(principal.name)
    return view(answer(_known(reads, name)))


@router.post(
    "",
    status_code=201,
    response_model=ReservationView,
    responses=WRITE_ERRORS,
    dependencies=[Depends(operator("make reservations"))],
)
async def create_reservation(
    body: NewReservation, publisher: PublisherDep, reads: ReadsDep, principal: PrincipalDep
) -> ReservationView:
    """Make a reservation (event ReservationCreated): operators only. Its GPUs are every
    GPU of `nodes`, or `gpus.count` GPUs the gateway chooses; a start in the past is now."""
    answer(await create(publisher, reads, body, principal, datetime.now(UTC)))
    return await _after_write(reads, body.name, principal)


@router.patch(
    "/{name}",
    response_model=ReservationView,
    responses=WRITE_ERRORS,
    dependencies=[Depends(operator("change reservations"))],
)
async def update_reservation(
    name: ReservationName,
    body: ReservationChange,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
) -> ReservationView:
    """Change a reservation (event ReservationUpdated, with the whole new spec): operators
    only. Each field given replaces what it was, checked as a new one against the others."""
    answer(await update(publisher, reads, name, body, principal, datetime.now(UTC)))
    return await _after_write(reads, name, principal)


@router.delete(
    "/{name}",
    status_code=204,
    responses={403: WRITE_ERRORS[403]},
    dependencies=[Depends(operator("delete reservations"))],
)
async def delete_reservation(
    name: ReservationName, publisher: PublisherDep, reads: ReadsDep, principal: PrincipalDep
) -> Response:
    """Remove a reservation (event ReservationDeleted): operators only. The queue cancels
    its waiting jobs (reason ReservationGone); its running jobs run on."""
    answer(await delete(publisher, reads, name, principal))
    return Response(status_code=204)


async def create(
    publisher: Publisher, reads: Reads, body: NewReservation, principal: Principal, now: datetime
) -> Refusal | None:
    """The command of POST /v1/reservations: None once written and folded."""
    await reads.catch_up(principal.name)
    known = reads.reservations.named(body.name)
    if isinstance(known, Refused):
        return known
    if known is not None:
        return Refused(409, f"reservation {body.name} exists")
    wanted = new_wanted(body, now)
    if isinstance(wanted, Invalid):
        return wanted
    return await _write(publisher, reads, wanted, ReservationCreated, principal)


async def update(
    publisher: Publisher,
    reads: Reads,
    name: str,
    body: ReservationChange,
    principal: Principal,
    now: datetime,
) -> Refusal | None:
    """The command of PATCH /v1/reservations/{name}: None once written and folded."""
    await reads.catch_up(principal.name)
    known = _known(reads, name)
    if isinstance(known, Refused):
        return known
    wanted = changed_wanted(known, body, now)
    if isinstance(wanted, Invalid):
        return wanted
    return await _write(publisher, reads, wanted, ReservationUpdated, principal)


async def delete(
    publisher: Publisher, reads: Reads, name: str, principal: Principal
) -> Refused | None:
    """The command of DELETE /v1/reservations/{name}: None once written and folded."""
    await reads.catch_up(principal.name)
    known = _known(reads, name)
    if isinstance(known, Refused):
        return known
    return await _logged(publisher, reads, ReservationDeleted(name=name), principal)


async def _write(
    publisher: Publisher,
    reads: Reads,
    wanted: Wanted,
    made: type[ReservationCreated | ReservationUpdated],
    principal: Principal,
) -> Refusal | None:
    """Choose the GPUs of `wanted` and write `made` with its spec, or the refusal."""
    spec = reads.reservations.plan(wanted)
    if isinstance(spec, Refused | Invalid):
        return spec
    return await _logged(publisher, reads, made(name=wanted.name, spec=spec), principal)


async def _logged(
    publisher: Publisher, reads: Reads, event: Event, principal: Principal
) -> Refused | None:
    """Write `event`: None once folded, the log's refusal, or 409 with the reason the
    fold voided it (another request got there first)."""
    recorded = await publisher.publish(event, principal=principal)
    if isinstance(recorded, Refused):
        return recorded
    voided = await reads.voided_reason(recorded.seq)
    return Refused(409, voided) if voided is not None else None


def _known(reads: Reads, name: str) -> AdvanceReservation | Refused:
    known = reads.reservations.named(name)
    if known is None:
        return not_found(f"reservation {name}")
    return known


async def _after_write(reads: Reads, name: str, principal: Principal) -> ReservationView:
    """The reservation as the log has it once the caller's own writes are folded."""
    await reads.catch_up(principal.name)
    return view(answer(_known(reads, name)))

"""Fold rules of advance reservations (docs/reservations.md).

Created and updated reservations are checked against the state as the log stands
(`gpuloom.state.reservations.reservation_problem`): every process voids the same ones,
with the same reason, so that two gateways that raced make one of them, not both.
Placement writes the start and the end when their time comes; the end removes it.
"""

from __future__ import annotations

from dataclasses import replace

from gpuloom.events.reservations import (
    ReservationCreated,
    ReservationDeleted,
    ReservationEnded,
    ReservationStarted,
    ReservationUpdated,
)
from gpuloom.state.errors import Invalid
from gpuloom.state.model import ClusterState
from gpuloom.state.reservations import folded, reservation_problem
from gpuloom.state.rules.common import Rule, rule
from gpuloom.state.step import Step
from gpuloom.state.tenancy import AdvanceReservation

#: The most reservations not ended at once: each pass fences their GPUs, so they are a
#: budget like any other shared resource (the gateway refuses the next one with 409).
RESERVATIONS_MAX = 1_000
#: The most GPUs all of them hold together (a GPU held in two windows counts twice): what
#: the state, every pass and `GET /v1/reservations` carry stays bounded.
RESERVED_GPUS_MAX = 200_000


def _created(state: ClusterState, event: ReservationCreated, step: Step) -> None:
    if event.name in state.reservations:
        raise Invalid(f"reservation {event.name} exists")
    if len(state.reservations) >= RESERVATIONS_MAX:
        raise Invalid(f"at most {RESERVATIONS_MAX} reservations may be pending or active")
    _keep(state, folded(event.name, event.spec), step)


def _updated(state: ClusterState, event: ReservationUpdated, step: Step) -> None:
    known = state.reservations.get(event.name)
    if known is None:
        raise Invalid(f"reservation {event.name} does not exist")
    # a start moved into the future takes the start back; placement writes it again
    started = known.started and event.spec.start <= step.envelope.at
    _keep(state, folded(event.name, event.spec, started=started), step)


def _keep(state: ClusterState, wanted: AdvanceReservation, step: Step) -> None:
    if wanted.end <= step.envelope.at:
        raise Invalid(f"reservation {wanted.name} would end before now")
    others = sum(len(r.gpus) for r in state.reservations.values() if r.name != wanted.name)
    if others + len(wanted.gpus) > RESERVED_GPUS_MAX:
        raise Invalid(
            f"reservations may hold at most {RESERVED_GPUS_MAX} GPUs together; "
            f"{others} are held, this one asks {len(wanted.gpus)}"
        )
    problem = reservation_problem(state, wanted)
    if problem is not None:
        raise Invalid(f"reservation {wanted.name}: {problem}")
    state.reservations[wanted.name] = wanted
    _changed_nodes(wanted, step)


def _deleted(state: ClusterState, event: ReservationDeleted, step: Step) -> None:
    known = state.reservations.pop(event.name, None)
    if known is None:
        raise Invalid(f"reservation {event.name} does not exist")
    _changed_nodes(known, step)


def _started(state: ClusterState, event: ReservationStarted, step: Step) -> None:
    known = state.reservations.get(event.name)
    if known is None:
        raise Invalid(f"reservation {event.name} does not exist")
    if known.started:
        raise Invalid(f"reservation {event.name} has started already")
    if step.envelope.at < known.start:
        raise Invalid(f"reservation {event.name} starts at {known.start.isoformat()}")
    state.reservations[event.name] = replace(known, started=True)
    _changed_nodes(known, step)


def _ended(state: ClusterState, event: ReservationEnded, step: Step) -> None:
    known = state.reservations.get(event.name)
    if known is None:
        raise Invalid(f"reservation {event.name} does not exist")
    if step.envelope.at < known.end:
        raise Invalid(f"reservation {event.name} ends at {known.end.isoformat()}")
    del state.reservations[event.name]
    _changed_nodes(known, step)


def _changed_nodes(reservation: AdvanceReservation, step: Step) -> None:
    """What placement sees of its nodes changes (their GPUs are fenced or free again)."""
    for name in sorted({node for node, _ in reservation.gpus}):
        step.changed_node(name)


RULES: tuple[Rule, ...] = (
    rule(ReservationCreated, _created),
    rule(ReservationUpdated, _updated),
    rule(ReservationDeleted, _deleted),
    rule(ReservationStarted, _started),
    rule(ReservationEnded, _ended),
)

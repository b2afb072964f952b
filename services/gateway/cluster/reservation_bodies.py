"""The bodies of /v1/reservations and what they mean, apart from the routes
(`cluster.reservations`): a new reservation (`NewReservation`), a change to one
(`ReservationChange`), each resolved to what the operator wants (`reads.reservations.
Wanted`: its window with a start in the past taken as now, its nodes or its number of
GPUs) or 422 naming the field at fault; and a folded reservation as the API shows it
(`ReservationView`). Pure: the time is an argument."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated, Literal, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gpuloom.decide.reservations import GpuAsk
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.policies import MEMBERS_MAX
from gpuloom.events.reservations import RESERVATION_GPUS_MAX, Flag
from gpuloom.events.text import INT32_MAX, ModelName, Remark, TopologyName, UserName
from gpuloom.state.tenancy import AdvanceReservation
from services.gateway.bodies import Body
from services.gateway.reads.reservations import Wanted
from services.gateway.refusals import Invalid

T = TypeVar("T")
Token = Annotated[str, Field(pattern=SUBJECT_TOKEN.pattern)]
Start = AwareDatetime | Literal["now"]


class GpusBody(Body):
    """`count` whole GPUs of these models and pool, all inside one domain of
    `topology_level` if given; the gateway chooses which (the tightest domain that has
    them free for the window, on as few nodes as it can)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    count: int = Field(ge=1, le=RESERVATION_GPUS_MAX)
    #: Any of these models (none: any model).
    gpu_model: list[ModelName] = Field(default_factory=list, max_length=64)
    pool: Literal["physical", "vgpu", "any"] = "any"
    topology_level: TopologyName | None = None

    def ask(self) -> GpuAsk:
        return GpuAsk(
            count=self.count,
            models=tuple(self.gpu_model),
            pool=self.pool,
            level=self.topology_level,
        )


class ReservationChange(Body):
    """A change to a reservation: each field given replaces what it was. A new `start`
    alone moves the end with it (the same duration); `nodes` or `gpus` choose its GPUs
    again, neither keeps them."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: An ISO 8601 time with its offset, or `now`; a time in the past is taken as now.
    start: Start | None = None
    end: AwareDatetime | None = None
    #: The end as seconds after the start (instead of `end`).
    duration_s: int | None = Field(default=None, gt=0, le=INT32_MAX)
    #: Every GPU of these nodes (instead of `gpus`).
    nodes: list[Token] | None = Field(default=None, min_length=1, max_length=10_000)
    gpus: GpusBody | None = None
    #: Who may run jobs in it: these users, or jobs under these accounts.
    users: list[UserName] | None = Field(default=None, max_length=MEMBERS_MAX)
    accounts: list[Token] | None = Field(default=None, max_length=MEMBERS_MAX)
    #: `maint`: a maintenance window, no job runs in it; `ignore_jobs`: made although
    #: running jobs may still hold its GPUs at its start.
    flags: list[Flag] | None = Field(default=None, max_length=2)
    description: Remark | None = None


class NewReservation(ReservationChange):
    """A new reservation: `end` or `duration_s`, and `nodes` or `gpus`, one of each."""

    name: Token
    start: Start = "now"


class GpuRef(BaseModel):
    node: str
    index: int


class ReservationView(BaseModel):
    """A reservation as the log has it."""

    name: str
    start: datetime
    end: datetime
    #: The GPUs it holds, by node and index.
    gpus: list[GpuRef]
    #: The nodes of its GPUs.
    nodes: list[str]
    users: list[str]
    accounts: list[str]
    flags: list[Flag]
    description: str
    #: Placement wrote its start (ReservationStarted): its jobs may run, no other may.
    started: bool
    #: `active` once started, else `pending`.
    state: Literal["pending", "active"]


class ReservationList(BaseModel):
    reservations: list[ReservationView]


def view(known: AdvanceReservation) -> ReservationView:
    return ReservationView(
        name=known.name,
        start=known.start,
        end=known.end,
        gpus=[GpuRef(node=node, index=index) for node, index in known.gpus],
        nodes=sorted({node for node, _ in known.gpus}),
        users=list(known.users),
        accounts=list(known.accounts),
        flags=flags_of(known),
        description=known.description,
        started=known.started,
        state="active" if known.started else "pending",
    )


def flags_of(known: AdvanceReservation) -> list[Flag]:
    flags: list[Flag] = []
    if known.ignore_jobs:
        flags.append("ignore_jobs")
    if known.maint:
        flags.append("maint")
    return flags


def new_wanted(body: NewReservation, now: datetime) -> Wanted | Invalid:
    """What POST /v1/reservations asks for, or 422 naming the field at fault."""
    start = _start(body.start, now)
    end = _end(start, body.end, body.duration_s, None)
    if isinstance(end, Invalid):
        return end
    if body.nodes is None and body.gpus is None:
        return Invalid.at(("body", "nodes"), "give nodes or gpus (a number of GPUs)")
    return _wanted(body, body.name, start, end, None)


def changed_wanted(
    known: AdvanceReservation, body: ReservationChange, now: datetime
) -> Wanted | Invalid:
    """Reservation `known` with PATCH's `body` applied, or 422 naming the field at fault.
    A new start without a new end keeps the duration."""
    if body.start is None:
        start, default = known.start, known.end
    else:
        start = _start(body.start, now)
        default = start + (known.end - known.start)
    end = _end(start, body.end, body.duration_s, default)
    if isinstance(end, Invalid):
        return end
    return _wanted(body, known.name, start, end, known)


def _start(start: Start, now: datetime) -> datetime:
    return now if start == "now" or start < now else start


def _end(
    start: datetime, end: datetime | None, duration_s: int | None, default: datetime | None
) -> datetime | Invalid:
    """`end`, or `duration_s` after the start, or `default` (None: one of the first two is
    required); 422 naming `end` when it is not after the start."""
    if end is not None and duration_s is not None:
        return Invalid.at(("body", "duration_s"), "give end or duration_s, not both")
    if end is None and duration_s is not None:
        end = start + timedelta(seconds=duration_s)
    end = end if end is not None else default
    if end is None:
        return Invalid.at(("body", "end"), "give end or duration_s (seconds after start)")
    if end <= start:
        return Invalid.at(
            ("body", "end"),
            f"end {end.isoformat()} is not after the start {start.isoformat()} "
            "(a start in the past is now)",
        )
    return end


def _wanted(
    body: ReservationChange,
    name: str,
    start: datetime,
    end: datetime,
    known: AdvanceReservation | None,
) -> Wanted | Invalid:
    """`body`'s GPUs, members, flags and description over what `known` had (None: a new
    one), or 422 naming the field at fault."""
    if body.nodes is not None and body.gpus is not None:
        return Invalid.at(("body", "gpus"), "give nodes or gpus, not both")
    wanted = Wanted(
        name=name,
        start=start,
        end=end,
        nodes=tuple(body.nodes) if body.nodes is not None else None,
        ask=body.gpus.ask() if body.gpus is not None else None,
        kept=known.gpus if known is not None else (),
        users=_given(body.users, known.users if known is not None else ()),
        accounts=_given(body.accounts, known.accounts if known is not None else ()),
        flags=_given(body.flags, tuple(flags_of(known)) if known is not None else ()),
        description=(
            body.description
            if body.description is not None
            else known.description
            if known is not None
            else ""
        ),
    )
    if not wanted.users and not wanted.accounts and "maint" not in wanted.flags:
        return Invalid.at(
            ("body", "users"),
            "give users or accounts to let in (or flag maint: a maintenance window)",
        )
    return wanted


def _given(value: Sequence[T] | None, old: tuple[T, ...]) -> tuple[T, ...]:
    return tuple(value) if value is not None else old

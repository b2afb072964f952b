"""Advance reservations (Slurm's `scontrol create reservation`): GPUs held for a window of
time for some users or accounts, or for maintenance (docs/reservations.md).

Operators write them through the gateway, which chose the GPUs (named nodes, or a number
of GPUs of a model, pool and topology) from the state it folded; the event carries the
GPUs themselves, so every process reads the same reservation and the fold checks it
(`gpuloom.state.reservations`): a name that exists, a window that overlaps another
reservation on the same GPUs, or running jobs that would still hold its GPUs at its
start (unless `ignore_jobs`) void it, with the reason.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, field_validator, model_validator

from gpuloom.events.base import SUBJECT_TOKEN, Event
from gpuloom.events.policies import MEMBERS_MAX, account_names, sorted_members
from gpuloom.events.text import Remark, UserName

#: The most GPUs one reservation holds.
RESERVATION_GPUS_MAX = 100_000
#: What a reservation may say of itself: `maint`, a maintenance window no job may use
#: (its nodes drain in time); `ignore_jobs`, made even though running jobs may still
#: hold its GPUs at its start (they run on; the reservation's jobs wait for them).
Flag = Literal["maint", "ignore_jobs"]


class ReservedGpu(BaseModel):
    """One GPU a reservation holds."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str = Field(pattern=SUBJECT_TOKEN.pattern)
    index: int = Field(ge=0, le=1023)


class ReservationSpec(BaseModel):
    """What a reservation is: its window, its GPUs, who may use it, and its flags."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    start: AwareDatetime
    end: AwareDatetime
    gpus: list[ReservedGpu] = Field(min_length=1, max_length=RESERVATION_GPUS_MAX)
    #: Who may run jobs in it: these users, or jobs under these accounts (a `maint`
    #: reservation: nobody). Both empty: nobody but the maintenance it is for.
    users: list[UserName] = Field(default_factory=list, max_length=MEMBERS_MAX)
    accounts: list[str] = Field(default_factory=list, max_length=MEMBERS_MAX)
    flags: list[Flag] = Field(default_factory=list, max_length=2)
    description: Remark = ""

    @field_validator("users", "accounts", "flags")
    @classmethod
    def _sorted(cls, value: list[str]) -> list[str]:
        return sorted_members(value)

    @field_validator("accounts")
    @classmethod
    def _account_names(cls, value: list[str]) -> list[str]:
        return account_names(value)

    @field_validator("gpus")
    @classmethod
    def _gpus_once(cls, value: list[ReservedGpu]) -> list[ReservedGpu]:
        ordered = sorted(set(value), key=lambda g: (g.node, g.index))
        if len(ordered) != len(value):
            raise ValueError("a GPU is named twice")
        return ordered

    @model_validator(mode="after")
    def _window(self) -> ReservationSpec:
        if self.end <= self.start:
            raise ValueError("end must be after start")
        return self

    @property
    def maint(self) -> bool:
        return "maint" in self.flags

    @property
    def ignore_jobs(self) -> bool:
        return "ignore_jobs" in self.flags


class ReservationCreated(Event):
    """An operator made reservation `name` (void if the name exists)."""

    TYPE: ClassVar[str] = "ReservationCreated"
    AGGREGATE: ClassVar[str] = "reservation"
    name: str = Field(pattern=SUBJECT_TOKEN.pattern)
    spec: ReservationSpec

    def aggregate_id(self) -> str:
        return self.name


class ReservationUpdated(Event):
    """An operator changed reservation `name`: `spec` replaces what it was (void if it does
    not exist; the same checks as a new one, against every other reservation)."""

    TYPE: ClassVar[str] = "ReservationUpdated"
    AGGREGATE: ClassVar[str] = "reservation"
    name: str = Field(pattern=SUBJECT_TOKEN.pattern)
    spec: ReservationSpec

    def aggregate_id(self) -> str:
        return self.name


class ReservationDeleted(Event):
    """An operator removed reservation `name`. Its waiting jobs are cancelled by the queue
    (`ReservationGone`); its running jobs run on."""

    TYPE: ClassVar[str] = "ReservationDeleted"
    AGGREGATE: ClassVar[str] = "reservation"
    name: str = Field(pattern=SUBJECT_TOKEN.pattern)

    def aggregate_id(self) -> str:
        return self.name


class ReservationStarted(Event):
    """Reservation `name` reached its start (placement writes it at that time, so that the
    log's clock passes it even when nothing else happens): its jobs may run now."""

    TYPE: ClassVar[str] = "ReservationStarted"
    AGGREGATE: ClassVar[str] = "reservation"
    name: str = Field(pattern=SUBJECT_TOKEN.pattern)

    def aggregate_id(self) -> str:
        return self.name


class ReservationEnded(Event):
    """Reservation `name` reached its end (placement writes it at that time): it is gone,
    its waiting jobs are cancelled by the queue, its running jobs run on."""

    TYPE: ClassVar[str] = "ReservationEnded"
    AGGREGATE: ClassVar[str] = "reservation"
    name: str = Field(pattern=SUBJECT_TOKEN.pattern)

    def aggregate_id(self) -> str:
        return self.name

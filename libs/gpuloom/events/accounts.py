"""Events written by admins through the gateway: accounts and their fair-share shares."""

from __future__ import annotations

import re
from typing import ClassVar

from pydantic import Field, field_validator

from gpuloom.events.base import SUBJECT_TOKEN, Event
from gpuloom.events.text import Remark, UserName

#: The largest quota amount: milli-GPU of a million GPUs, with room to add.
QUOTA_MAX = 2**53
#: The resource of all GPU time, in milli-GPU (1000 per whole GPU): a quota's default.
GPU_MILLI = "gpu_milli"
#: Whole GPUs, a count: a quota's other resource that every job's request says upfront.
GPUS = "gpus"


def model_resource(model: str) -> str:
    """The resource of the milli-GPU of one GPU model (`model:<model>`)."""
    return f"model:{model}"


def pool_resource(pool: str) -> str:
    """The resource of the milli-GPU of one pool (`pool:physical`, `pool:vgpu`)."""
    return f"pool:{pool}"


def depends_on_where(resource: str) -> bool:
    """Whether what a job takes of `resource` follows from where it lands (a model's or a
    pool's), not from its request alone."""
    return resource.startswith(("model:", "pool:"))


#: The resource kinds a quota may limit (`gpuloom.queueing.quota`): all GPU time,
#: whole GPUs, the milli-GPU of one GPU model or of one pool.
RESOURCE = re.compile(
    r"^(gpu_milli|gpus|model:[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}|pool:(vgpu|physical))$"
)


class AccountEvent(Event):
    """An event about one account."""

    AGGREGATE: ClassVar[str] = "account"
    account: str = Field(pattern=SUBJECT_TOKEN.pattern)

    def aggregate_id(self) -> str:
        return self.account


class AccountCreated(AccountEvent):
    """An account joined the hierarchy (organisation -> team -> ...), under `parent`."""

    TYPE: ClassVar[str] = "AccountCreated"
    #: 2: strings and integers within what storage, the bus and exec hold.
    VERSION: ClassVar[int] = 2
    parent: str | None = Field(default=None, pattern=SUBJECT_TOKEN.pattern)
    description: Remark = ""


class SharesSet(AccountEvent):
    """The account's fair-share shares: its entitlement relative to the others."""

    TYPE: ClassVar[str] = "SharesSet"
    shares: int = Field(ge=0, le=1_000_000)


class QuotaSet(AccountEvent):
    """The account's quota of one resource kind, as in Kueue.

    `resource`: `gpu_milli` (all GPU time, 1000 per whole GPU), `gpus` (whole
    GPUs, a count), `model:<name>` or `pool:vgpu|physical` (milli-GPU of that
    model or pool). `nominal`: what it is entitled to; `borrowing_limit`: how much
    more it may take from the unused nominal quota of its siblings (same parent;
    None: as much as they leave idle); `cap`: a hard ceiling. None for `nominal`
    removes the quota of that resource.
    """

    TYPE: ClassVar[str] = "QuotaSet"
    resource: str = Field(default=GPU_MILLI, pattern=RESOURCE.pattern)
    nominal: int | None = Field(default=None, ge=0, le=QUOTA_MAX)
    borrowing_limit: int | None = Field(default=None, ge=0, le=QUOTA_MAX)
    cap: int | None = Field(default=None, ge=0, le=QUOTA_MAX)


class AccountUsersSet(AccountEvent):
    """The users who may submit under the account (as Slurm's user associations).

    Empty: anyone may (the default). Admission rejects a job of a user who is not
    listed, with the reason.
    """

    TYPE: ClassVar[str] = "AccountUsersSet"
    #: 2: strings and integers within what storage, the bus and exec hold.
    VERSION: ClassVar[int] = 2
    users: list[UserName] = Field(default_factory=list, max_length=10_000)

    @field_validator("users")
    @classmethod
    def _users_sorted(cls, value: list[str]) -> list[str]:
        return sorted(set(value))


class AccountCoordinatorsSet(AccountEvent):
    """The account's coordinators (Slurm's coordinators): users who manage its
    subtree (members, sub-accounts, sub-accounts' shares), cancel its jobs and read
    their logs and its usage. Named per account, not a token role; empty: none."""

    TYPE: ClassVar[str] = "AccountCoordinatorsSet"
    coordinators: list[UserName] = Field(default_factory=list, max_length=1000)

    @field_validator("coordinators")
    @classmethod
    def _coordinators_sorted(cls, value: list[str]) -> list[str]:
        return sorted(set(value))

"""Events written by operators through the gateway: priority classes and per-identity limits.

A priority class (as Kubernetes' PriorityClass or Slurm's QOS) takes priority and
preemption out of the submitter's hands: a job names a class, its priority is the
class's (or lower), and only classes that `may_preempt` stop other jobs. Limits (as
Slurm's MaxSubmitJobs, MaxArraySize and GrpTRES=gres/gpu) bound what one user or one
account may have submitted and hold.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from gpuloom.events.base import SUBJECT_TOKEN, Event
from gpuloom.events.text import INT32_MAX, Remark, UserName

#: The bounds of a job's priority (JobSpec.priority), and so of a class's.
PRIORITY_MIN = -1_000_000
PRIORITY_MAX = 1_000_000
#: The class of a submission that names none when no class is the default: priority 0,
#: may preempt, open to everyone. Defining a class of this name replaces it.
BUILTIN_CLASS = "normal"
#: The most users or accounts one class may list.
MEMBERS_MAX = 10_000


def sorted_members(value: list[str]) -> list[str]:
    """Sorted and without repeats: the same list of users or accounts reads the same,
    whatever the order it was given in (priority classes, reservations)."""
    return sorted(set(value))


def account_names(value: list[str]) -> list[str]:
    """`value`, each an account name, or ValueError naming the one that is not."""
    for account in value:
        if not SUBJECT_TOKEN.match(account):
            raise ValueError(f"{account!r} is not an account name")
    return value


class PriorityClassSet(Event):
    """An operator defined (or redefined) priority class `name`.

    `priority` is the class's priority and the most a job in it may ask for;
    `may_preempt` false (Kubernetes' `preemptionPolicy: Never`) means its jobs never
    stop others. `users` and `accounts` may use it (a job's user is listed, or its
    account is); both empty: everyone. `default`: the class of a submission that
    names none; the fold clears it on every other class.
    """

    TYPE: ClassVar[str] = "PriorityClassSet"
    AGGREGATE: ClassVar[str] = "priorityclass"
    name: str = Field(pattern=SUBJECT_TOKEN.pattern)
    priority: int = Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)
    may_preempt: bool = True
    users: list[UserName] = Field(default_factory=list, max_length=MEMBERS_MAX)
    accounts: list[str] = Field(default_factory=list, max_length=MEMBERS_MAX)
    description: Remark = ""
    default: bool = False

    @field_validator("users", "accounts")
    @classmethod
    def _sorted(cls, value: list[str]) -> list[str]:
        return sorted_members(value)

    @field_validator("accounts")
    @classmethod
    def _account_names(cls, value: list[str]) -> list[str]:
        return account_names(value)

    def aggregate_id(self) -> str:
        return self.name


class PriorityClassDeleted(Event):
    """An operator removed priority class `name`.

    Jobs already in it keep their recorded priority; pending ones are no longer
    allowed to preempt (their class is unknown) and new submissions may not name it.
    """

    TYPE: ClassVar[str] = "PriorityClassDeleted"
    AGGREGATE: ClassVar[str] = "priorityclass"
    name: str = Field(pattern=SUBJECT_TOKEN.pattern)

    def aggregate_id(self) -> str:
        return self.name


LimitScope = Literal["user", "account", "default", "cluster"]
#: The names a scope takes beside user and account names: ("default", "user") holds
#: what every user gets where their own limit is None, ("default", "account") the same
#: for accounts, ("cluster", "all") the cluster's total.
SCOPE_NAMES: dict[str, tuple[str, ...]] = {
    "default": ("user", "account"),
    "cluster": ("all",),
}


class LimitsSet(Event):
    """An operator set the limits of one user, one account, the defaults or the cluster.

    None is "not set here": a user's or account's unset limit is the default scope's
    ("default", "user" or "account"), and where that is unset too, the built-in one
    (`gpuloom.queueing.limits.BUILT_IN`); the cluster's (`("cluster", "all")`, only
    `max_submit_jobs`: jobs not final of everyone together) likewise.

    - `max_submit_jobs`: jobs submitted and not yet final (pending and running);
      a job array counts as its number of tasks;
    - `max_array_size`: tasks in one job array;
    - `max_gpus`: GPUs held by placed and running jobs, where a fraction counts as
      its share (two jobs of 500 milli-GPU hold one GPU). A job that would pass it
      waits (reason AssocGrpGRES) rather than being rejected.

    Each LimitsSet replaces every limit of its scope and name; all None removes them.
    The subject's id is the scope (a user name need not be a subject token).
    `max_gpus` is per user or account only (the default and cluster scopes refuse it).
    """

    TYPE: ClassVar[str] = "LimitsSet"
    VERSION: ClassVar[int] = 2
    AGGREGATE: ClassVar[str] = "limits"
    scope: LimitScope
    name: UserName
    max_submit_jobs: int | None = Field(default=None, ge=0, le=INT32_MAX)
    max_array_size: int | None = Field(default=None, ge=1, le=INT32_MAX)
    max_gpus: int | None = Field(default=None, ge=0, le=INT32_MAX)

    @model_validator(mode="after")
    def _account_name(self) -> LimitsSet:
        if self.scope == "account" and not SUBJECT_TOKEN.match(self.name):
            raise ValueError(f"{self.name!r} is not an account name")
        names = SCOPE_NAMES.get(self.scope)
        if names is not None:
            if self.name not in names:
                raise ValueError(
                    f"the {self.scope} scope's name is {' or '.join(names)}, not {self.name!r}"
                )
            if self.max_gpus is not None:
                raise ValueError(f"max_gpus is set per user or account, not in {self.scope}")
        if self.scope == "cluster" and self.max_array_size is not None:
            raise ValueError("max_array_size is set per user or account, or as a default")
        return self

    def aggregate_id(self) -> str:
        return self.scope

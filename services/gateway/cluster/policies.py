"""/v1/priority-classes and /v1/limits: the operators' policies on who runs what.

Anyone authenticated reads them (a user sees which classes they may use and the
limits they are held to); only operators change them (events PriorityClassSet,
PriorityClassDeleted, LimitsSet). Each write answers the policy as the log has it
once the gateway folded its own write; what refuses a write is returned
(`refusals.Refused`, `Invalid`) and answered by its route.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path
from pydantic import BaseModel, Field, ValidationError

from gpuloom.auth import Principal
from gpuloom.events import LimitsSet, PriorityClassDeleted, PriorityClassSet
from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.policies import MEMBERS_MAX, PRIORITY_MAX, PRIORITY_MIN
from gpuloom.events.text import INT32_MAX, Remark, UserName
from gpuloom.state.tenancy import IdentityLimits
from gpuloom.state.tenancy import PriorityClass as FoldedClass
from services.gateway.auth import PrincipalDep, operator
from services.gateway.bodies import Body
from services.gateway.deps import PublisherDep, ReadsDep
from services.gateway.publish import Publisher
from services.gateway.reads import Reads
from services.gateway.reads.policies import ClassBook, LimitBook
from services.gateway.refusals import Invalid, Refused, answer
from services.gateway.schemas import Problem

router = APIRouter(tags=["policies"])

ClassName = Annotated[
    str, Path(pattern=SUBJECT_TOKEN.pattern, description="a priority class's name")
]
Scope = Literal["user", "account", "default", "cluster"]
ERRORS: dict[int | str, dict[str, Any]] = {
    403: {"model": Problem, "description": "not an operator"},
    503: {"model": Problem, "description": "NATS unreachable, or the log not read yet"},
}


class PriorityClassBody(Body):
    """A priority class as an operator defines it (see PriorityClassSet)."""

    priority: int = Field(ge=PRIORITY_MIN, le=PRIORITY_MAX)
    #: false: its jobs never stop others (Kubernetes' preemptionPolicy Never).
    may_preempt: bool = True
    #: Who may use it: these users, or jobs under these accounts; both empty: anyone.
    users: list[UserName] = Field(default_factory=list, max_length=MEMBERS_MAX)
    accounts: list[Annotated[str, Field(pattern=SUBJECT_TOKEN.pattern)]] = Field(
        default_factory=list, max_length=MEMBERS_MAX
    )
    description: Remark = ""
    #: The class of submissions that name none (it clears the flag on every other).
    default: bool = False


class PriorityClassView(PriorityClassBody):
    name: str
    #: The built-in `normal` class (no operator defined one of that name).
    builtin: bool = False


class PriorityClassList(BaseModel):
    classes: list[PriorityClassView]
    #: The class of a submission that names none.
    default: str


class LimitsBody(Body):
    """The limits of one user or account, the defaults of every user or account
    (scope `default`, name `user` or `account`), or the cluster's total (scope
    `cluster`, name `all`: `max_submit_jobs` only); null (or absent): not set here, so
    the default's, else the built-in one (`defaults` in the list says which apply)."""

    #: Jobs submitted and not final (pending and running); an array counts its tasks.
    max_submit_jobs: int | None = Field(default=None, ge=0, le=INT32_MAX)
    #: Tasks in one job array.
    max_array_size: int | None = Field(default=None, ge=1, le=INT32_MAX)
    #: GPUs its placed and running jobs hold (a fraction counts as its share); a job
    #: that would pass it waits with the reason AssocGrpGRES.
    max_gpus: int | None = Field(default=None, ge=0, le=INT32_MAX)


class LimitsView(LimitsBody):
    scope: Scope
    name: str


class LimitsList(BaseModel):
    #: What operators set (LimitsSet), by scope and name.
    limits: list[LimitsView]
    #: What applies where nothing more specific is set: `user` and `account` (each
    #: limit the operators' default, else the built-in one) and `cluster`.
    defaults: dict[str, LimitsBody]


async def _classes_after(reads: Reads, principal: Principal) -> PriorityClassList:
    """The classes once the caller's own writes are folded (503 before the log is read)."""
    await reads.catch_up(principal.name)
    return _class_list(answer(reads.policies.class_book()))


async def _limits_after(reads: Reads, principal: Principal) -> LimitsList:
    """The limits once the caller's own writes are folded (503 before the log is read)."""
    await reads.catch_up(principal.name)
    return _limits_list(answer(reads.policies.limit_book()))


def _class_view(known: FoldedClass, book: ClassBook) -> PriorityClassView:
    return PriorityClassView(
        name=known.name,
        priority=known.priority,
        may_preempt=known.may_preempt,
        users=list(known.users),
        accounts=list(known.accounts),
        description=known.description,
        default=known.default,
        builtin=known.name not in book.defined,
    )


def _class_list(book: ClassBook) -> PriorityClassList:
    return PriorityClassList(
        classes=[_class_view(known, book) for known in book.classes], default=book.default
    )


@router.get("/v1/priority-classes", response_model=PriorityClassList)
async def list_priority_classes(reads: ReadsDep, principal: PrincipalDep) -> PriorityClassList:
    """Every priority class a job may name, and the default one."""
    return await _classes_after(reads, principal)


@router.put(
    "/v1/priority-classes/{name}",
    response_model=PriorityClassList,
    responses=ERRORS,
    dependencies=[Depends(operator("define priority classes"))],
)
async def set_priority_class(
    name: ClassName,
    body: PriorityClassBody,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
) -> PriorityClassList:
    """Define or redefine a priority class (event PriorityClassSet): operators only."""
    event = PriorityClassSet(name=name, **body.model_dump())
    answer(await publisher.publish(event, principal=principal))
    return await _classes_after(reads, principal)


@router.delete(
    "/v1/priority-classes/{name}",
    response_model=PriorityClassList,
    responses={**ERRORS, 404: {"model": Problem, "description": "no such class"}},
    dependencies=[Depends(operator("delete priority classes"))],
)
async def delete_priority_class(
    name: ClassName, publisher: PublisherDep, reads: ReadsDep, principal: PrincipalDep
) -> PriorityClassList:
    """Remove a priority class (event PriorityClassDeleted): operators only. Its jobs
    keep their priority; pending ones may no longer preempt."""
    answer(await _delete_class(publisher, reads, name, principal))
    return await _classes_after(reads, principal)


async def _delete_class(
    publisher: Publisher, reads: Reads, name: str, principal: Principal
) -> Refused | None:
    """The command of DELETE /v1/priority-classes/{name}: None once written."""
    await reads.catch_up(principal.name)
    defined = reads.policies.class_defined(name)
    if isinstance(defined, Refused):
        return defined
    if not defined:
        return Refused(404, f"priority class {name} not found")
    written = await publisher.publish(PriorityClassDeleted(name=name), principal=principal)
    return written if isinstance(written, Refused) else None


def _limits_list(book: LimitBook) -> LimitsList:
    def body(limits: IdentityLimits) -> dict[str, int | None]:
        return {
            "max_submit_jobs": limits.max_submit_jobs,
            "max_array_size": limits.max_array_size,
            "max_gpus": limits.max_gpus,
        }

    return LimitsList(
        limits=[
            LimitsView(scope=scope, name=name, **body(limits)) for (scope, name), limits in book.set
        ],
        defaults={scope: LimitsBody(**body(limits)) for scope, limits in book.defaults.items()},
    )


@router.get("/v1/limits", response_model=LimitsList)
async def list_limits(reads: ReadsDep, principal: PrincipalDep) -> LimitsList:
    """The limits operators set, and the defaults that hold where they set none."""
    return await _limits_after(reads, principal)


@router.put(
    "/v1/limits/{scope}/{name}",
    response_model=LimitsList,
    responses={**ERRORS, 422: {"description": "a bad limit, or an account name that is not one"}},
    dependencies=[Depends(operator("set limits"))],
)
async def set_limits(
    scope: Scope,
    name: Annotated[str, Path(min_length=1, max_length=100, description="a user or account")],
    body: LimitsBody,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
) -> LimitsList:
    """Set every limit of one user or account, of the defaults or of the cluster
    (event LimitsSet): operators only. A limit left out or null falls back to the
    default's, then the built-in one; all null removes the entry."""
    event = answer(_limits_event(scope, name, body))
    answer(await publisher.publish(event, principal=principal))
    return await _limits_after(reads, principal)


def _limits_event(scope: Scope, name: str, body: LimitsBody) -> LimitsSet | Invalid:
    """The LimitsSet of the request, or 422 naming the path's `name` (an account name
    that is not one)."""
    try:
        return LimitsSet(scope=scope, name=name, **body.model_dump())
    except ValidationError as exc:
        return Invalid.at(("path", "name"), str(exc.errors()[0]["msg"]))

"""Priority classes, as pure readings of the folded state.

The gateway asks these before it publishes a submission (a clear 403 at once), and
admission asks them again on the log, in submission order, which is what holds:
two submissions may both pass a gateway that has not folded the other yet, and
admission then rejects the one over the limit, with the same words.

Classes: a job names one (`JobSpec.priority_class`); None is a submission from
before classes, which keeps its priority and may preempt as it always could. A
submission naming none gets the default class: the one marked `default`, else
`normal`, an operator's class of that name or the built-in one (priority 0, may
preempt, open to everyone).
"""

from __future__ import annotations

from gpuloom.events import JobSpec
from gpuloom.events.policies import BUILTIN_CLASS
from gpuloom.state import ClusterState
from gpuloom.state.tenancy import PriorityClass

#: The class a cluster has before an operator defines any.
BUILTIN = PriorityClass(
    name=BUILTIN_CLASS,
    priority=0,
    may_preempt=True,
    description="built in: the class of every submission while no class is the default",
)


def class_named(state: ClusterState, name: str) -> PriorityClass | None:
    """The class `name`: an operator's, else the built-in `normal`; None if unknown."""
    known = state.priority_classes.get(name)
    if known is not None:
        return known
    return BUILTIN if name == BUILTIN_CLASS else None


def default_class(state: ClusterState) -> PriorityClass:
    """The class of a submission that names none (the fold keeps at most one default)."""
    for _, known in sorted(state.priority_classes.items()):
        if known.default:
            return known
    return class_named(state, BUILTIN_CLASS) or BUILTIN


def classes(state: ClusterState) -> list[PriorityClass]:
    """Every class a job may name, by name: the operators' and, unless they redefined
    it, the built-in `normal`."""
    found = dict(state.priority_classes)
    found.setdefault(BUILTIN_CLASS, BUILTIN)
    return [found[name] for name in sorted(found)]


def class_use_problem(known: PriorityClass, user: str, account: str) -> str | None:
    """Why `user` may not run a job under `account` in class `known`, if so: a class
    that lists users or accounts takes a listed user, or a job of a listed account."""
    if not known.users and not known.accounts:
        return None
    if user in known.users or account in known.accounts:
        return None
    return f"user {user} may not use priority class {known.name} (under account {account})"


def class_problem(state: ClusterState, spec: JobSpec) -> str | None:
    """Admission's check: the job's class exists and its user or account may use it."""
    if spec.priority_class is None:
        return None
    known = class_named(state, spec.priority_class)
    if known is None:
        return f"priority class {spec.priority_class} does not exist"
    return class_use_problem(known, spec.user, spec.account)


def may_preempt(state: ClusterState, spec: JobSpec) -> bool:
    """Whether the job may stop others: no class (an old submission) may, as before;
    a class with `may_preempt` false, or one deleted since, may not."""
    if spec.priority_class is None:
        return True
    known = class_named(state, spec.priority_class)
    return known is not None and known.may_preempt

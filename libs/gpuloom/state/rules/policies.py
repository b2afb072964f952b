"""Fold rules of the operators' policies: priority classes and per-identity limits.

Pure like every rule:
no clock, and nothing depends on dict or set order (at most one class is the
default, whatever order the classes were defined in).
"""

from __future__ import annotations

from dataclasses import replace

from gpuloom.events.policies import LimitsSet, PriorityClassDeleted, PriorityClassSet
from gpuloom.state.errors import Invalid
from gpuloom.state.model import ClusterState
from gpuloom.state.rules.common import Rule, rule
from gpuloom.state.step import Step
from gpuloom.state.tenancy import IdentityLimits, PriorityClass


def _class_set(state: ClusterState, event: PriorityClassSet, step: Step) -> None:
    """Define or redefine a class; a default one takes the default from every other."""
    if event.default:
        for name, other in sorted(state.priority_classes.items()):
            if other.default and name != event.name:
                state.priority_classes[name] = replace(other, default=False)
    state.priority_classes[event.name] = PriorityClass(
        name=event.name,
        priority=event.priority,
        may_preempt=event.may_preempt,
        users=tuple(event.users),
        accounts=tuple(event.accounts),
        description=event.description,
        default=event.default,
    )


def _class_deleted(state: ClusterState, event: PriorityClassDeleted, step: Step) -> None:
    if event.name not in state.priority_classes:
        raise Invalid(f"priority class {event.name} does not exist")
    del state.priority_classes[event.name]


def _limits_set(state: ClusterState, event: LimitsSet, step: Step) -> None:
    """Replace the limits of one identity; none left removes its entry."""
    limits = IdentityLimits(event.max_submit_jobs, event.max_array_size, event.max_gpus)
    if limits == IdentityLimits():
        state.limits.pop((event.scope, event.name), None)
    else:
        state.limits[(event.scope, event.name)] = limits


RULES: tuple[Rule, ...] = (
    rule(PriorityClassSet, _class_set),
    rule(PriorityClassDeleted, _class_deleted),
    rule(LimitsSet, _limits_set),
)

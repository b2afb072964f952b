"""Reads of the operators' policies as the gateway has folded them: the account tree
(`GET /v1/accounts`, what an account's change checks), the priority classes and the
limits (`GET /v1/priority-classes`, `/v1/limits`). Each is refused (503, no
Retry-After) before the gateway read the log."""

from __future__ import annotations

from dataclasses import dataclass

from gpuloom.queueing.classes import classes, default_class
from gpuloom.queueing.limits import cluster_limits, default_limits
from gpuloom.state import ClusterState
from gpuloom.state.tenancy import AccountState, IdentityLimits, PriorityClass
from services.gateway.reads.source import NOT_READ, Source
from services.gateway.refusals import Refused


@dataclass(frozen=True, slots=True)
class ClassBook:
    """Every priority class a job may name (the built-in one included), the default
    one's name, and the names operators defined."""

    classes: list[PriorityClass]
    default: str
    defined: frozenset[str]


@dataclass(frozen=True, slots=True)
class LimitBook:
    """The limits operators set, by (scope, name), sorted; and what holds where they set
    none: `user`, `account` and `cluster`."""

    set: list[tuple[tuple[str, str], IdentityLimits]]
    defaults: dict[str, IdentityLimits]


class PolicyReads:
    __slots__ = ("_source",)

    def __init__(self, source: Source) -> None:
        self._source = source

    def _fold(self) -> ClusterState | Refused:
        state = self._source.folded()
        return state if state is not None else Refused(503, NOT_READ)

    def account_tree(self) -> dict[str, AccountState] | Refused:
        """Every account by name."""
        state = self._fold()
        return state if isinstance(state, Refused) else state.accounts

    def class_book(self) -> ClassBook | Refused:
        state = self._fold()
        if isinstance(state, Refused):
            return state
        return ClassBook(
            classes=classes(state),
            default=default_class(state).name,
            defined=frozenset(state.priority_classes),
        )

    def class_defined(self, name: str) -> bool | Refused:
        """Whether an operator defined the class `name`."""
        state = self._fold()
        return state if isinstance(state, Refused) else name in state.priority_classes

    def limit_book(self) -> LimitBook | Refused:
        state = self._fold()
        if isinstance(state, Refused):
            return state
        defaults = {scope: default_limits(state, scope) for scope in ("user", "account")}
        return LimitBook(
            set=sorted(state.limits.items()),
            defaults=defaults | {"cluster": cluster_limits(state)},
        )

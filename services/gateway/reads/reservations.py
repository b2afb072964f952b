"""Reads of the advance reservations as the gateway has folded them (`GET
/v1/reservations`), and what an operator's new or changed one would hold (`plan`): its
GPUs chosen on the fold, then held to the rule the fold will hold the event to
(`gpuloom.state.reservations.reservation_problem`), so that the answer is the fold's
own (docs/reservations.md). Each is refused (503, no Retry-After) before the gateway
read the log."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from pydantic import ValidationError

from gpuloom.decide.reservations import GpuAsk, choose_gpus
from gpuloom.events.reservations import Flag, ReservationSpec, ReservedGpu
from gpuloom.state import ClusterState
from gpuloom.state.reservations import NAMED_MAX, folded, jobs_holding_at, reservation_problem
from gpuloom.state.tenancy import AdvanceReservation
from services.gateway.reads.source import NOT_READ, Source
from services.gateway.refusals import Invalid, Refusal, Refused

GpuKey = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Wanted:
    """A reservation as an operator asks for it, its window resolved (a start in the past
    is now): on named `nodes` (all their GPUs), on a number of GPUs (`ask`), or, both
    None, on the GPUs it holds (`kept`: an update that leaves them)."""

    name: str
    start: datetime
    end: datetime
    nodes: tuple[str, ...] | None = None
    ask: GpuAsk | None = None
    kept: tuple[GpuKey, ...] = ()
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    flags: tuple[Flag, ...] = ()
    description: str = ""


class ReservationReads:
    __slots__ = ("_source",)

    def __init__(self, source: Source) -> None:
        self._source = source

    def _fold(self) -> ClusterState | Refused:
        state = self._source.folded()
        return state if state is not None else Refused(503, NOT_READ)

    def book(self) -> list[AdvanceReservation] | Refused:
        """Every reservation that has not ended, by name."""
        state = self._fold()
        if isinstance(state, Refused):
            return state
        return [state.reservations[name] for name in sorted(state.reservations)]

    def named(self, name: str) -> AdvanceReservation | Refused | None:
        """Reservation `name`, or None (none of that name, or it ended)."""
        state = self._fold()
        return state if isinstance(state, Refused) else state.reservations.get(name)

    def plan(self, wanted: Wanted) -> ReservationSpec | Refusal:
        """The spec to write for `wanted` (`plan`), on the gateway's fold."""
        state = self._fold()
        return state if isinstance(state, Refused) else plan(state, wanted)


def plan(state: ClusterState, wanted: Wanted) -> ReservationSpec | Refusal:
    """The spec of `wanted` with its GPUs chosen, or why it cannot be made: 422 naming
    the field (a node or a GPU model, pool or topology level the cluster does not have),
    409 (too few GPUs free for the window, another reservation on them, running jobs
    that will still hold them at its start: named, unless `ignore_jobs`). Reservation
    `wanted.name` itself is left aside (an update is checked against the others)."""
    gpus: Sequence[GpuKey] | Refusal
    if wanted.nodes is not None:
        gpus = _on_nodes(state, wanted.nodes)
    elif wanted.ask is not None:
        gpus = _chosen(state, wanted)
    else:
        gpus = wanted.kept
    if isinstance(gpus, Refused | Invalid):
        return gpus
    try:
        spec = ReservationSpec(
            start=wanted.start,
            end=wanted.end,
            gpus=[ReservedGpu(node=node, index=index) for node, index in gpus],
            users=list(wanted.users),
            accounts=list(wanted.accounts),
            flags=list(wanted.flags),
            description=wanted.description,
        )
    except ValidationError as exc:  # the route's body checks the same: not expected
        return Invalid.at(("body",), str(exc.errors()[0]["msg"]))
    problem = reservation_problem(state, folded(wanted.name, spec))
    return Refused(409, problem) if problem is not None else spec


def _on_nodes(state: ClusterState, nodes: Sequence[str]) -> list[GpuKey] | Invalid:
    """Every GPU of `nodes`, or 422 naming the first node that is unknown or has none."""
    gpus: list[GpuKey] = []
    for number, name in enumerate(nodes):
        node = state.nodes.get(name)
        if node is None:
            known = ", ".join(sorted(state.nodes)) or "none"
            return Invalid.at(("body", "nodes", number), f"no node {name} (nodes: {known})")
        if not node.gpus:
            return Invalid.at(("body", "nodes", number), f"node {name} has no GPU")
        gpus.extend((name, index) for index in sorted(node.gpus))
    return sorted(set(gpus))


def _chosen(state: ClusterState, wanted: Wanted) -> list[GpuKey] | Refusal:
    """`choose_gpus` for `wanted.ask`, or 422 naming what the cluster does not have, or
    409 with why too few are free (naming the running jobs that hold the rest)."""
    ask = wanted.ask
    assert ask is not None
    unknown = _unknown_in_cluster(state, ask)
    if unknown is not None:
        return unknown
    ignore_jobs = "ignore_jobs" in wanted.flags
    found = choose_gpus(
        state, ask, wanted.start, wanted.end, ignore_jobs=ignore_jobs, besides=wanted.name
    )
    if not isinstance(found, str):
        return found
    if not ignore_jobs:  # would the GPUs running jobs hold make up the rest?
        anyway = choose_gpus(
            state, ask, wanted.start, wanted.end, ignore_jobs=True, besides=wanted.name
        )
        if not isinstance(anyway, str):
            holding = jobs_holding_at(state, set(anyway), wanted.start, besides=wanted.name)
            named = ", ".join(holding[:NAMED_MAX]) + (" ..." if len(holding) > NAMED_MAX else "")
            found += (
                f"; running job(s) {named} will still hold the rest at its start (their time "
                "limits end later, or they have none); flag ignore_jobs to make it anyway"
            )
    return Refused(409, found)


def _unknown_in_cluster(state: ClusterState, ask: GpuAsk) -> Invalid | None:
    """422 naming `gpus.topology_level`, `gpus.gpu_model` or `gpus.pool` when no node has
    it (as a submission's `resources_problem`)."""
    nodes = [state.nodes[name] for name in sorted(state.nodes)]
    if ask.level is not None:
        levels = sorted({place.level for node in nodes for place in node.spec.topology})
        if ask.level not in levels:
            return Invalid.at(
                ("body", "gpus", "topology_level"),
                f"no node names a {ask.level!r} level (levels in the cluster: "
                f"{', '.join(levels) or 'none'}; docs/topology.md)",
            )
    gpus = [gpu for node in nodes for gpu in node.gpus.values()]
    models = sorted({gpu.model for gpu in gpus})
    if ask.models and not set(ask.models) & set(models):
        return Invalid.at(
            ("body", "gpus", "gpu_model"),
            f"no node has GPU model {' or '.join(ask.models)} "
            f"(models in the cluster: {', '.join(models) or 'none'})",
        )
    if ask.pool != "any" and not any(gpu.pool == ask.pool for gpu in gpus):
        return Invalid.at(("body", "gpus", "pool"), f"no GPU is in the {ask.pool} pool")
    return None

"""Decisions about advance reservations (docs/reservations.md): when one starts and ends
(written by placement, at that time, so that the log's clock passes it), and which GPUs
one that asks for a number of them holds (asked by the gateway when an operator makes
it; the fold checks the result again).

Pure: the time is an argument (the service reads its clock, as accounting does for its
interim charges), and every order is by name and index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpuloom.events import Decision, ReservationEnded, ReservationStarted, intents
from gpuloom.state import ClusterState
from gpuloom.state.reservations import jobs_holding_at


def decide_reservation_times(state: ClusterState, now: datetime) -> list[Decision]:
    """ReservationEnded for each reservation whose end has come, ReservationStarted for
    each whose start has come."""
    decisions: list[Decision] = []
    for name, booked in sorted(state.reservations.items()):
        if booked.end <= now:
            key = intents.reservation_ended(name, booked.end.isoformat())
            decisions.append(Decision(ReservationEnded(name=name), key))
        elif not booked.started and booked.start <= now:
            key = intents.reservation_started(name, booked.start.isoformat())
            decisions.append(Decision(ReservationStarted(name=name), key))
    return decisions


@dataclass(frozen=True, slots=True)
class GpuAsk:
    """A reservation that asks for `count` whole GPUs rather than named nodes."""

    count: int
    models: Sequence[str] = ()
    pool: str = "any"
    #: All of them inside one domain of this topology level (None: anywhere).
    level: str | None = None


def choose_gpus(
    state: ClusterState,
    ask: GpuAsk,
    start: datetime,
    end: datetime,
    *,
    ignore_jobs: bool = False,
    besides: str = "",
) -> list[tuple[str, int]] | str:
    """The GPUs a reservation from `start` to `end` holds for `ask`, or why none can.

    Only GPUs of ready nodes, of the models and pool asked, in no other reservation at
    an overlapping time (reservation `besides` aside: the one being changed), and,
    unless `ignore_jobs`, that no running job will still hold at `start`. Among the
    domains of `level` (or the whole cluster) that have enough, the one with the fewest
    such GPUs (the tightest, as `gpuloom.placement.topology`), so that roomier domains
    stay whole; within it, nodes with the most such GPUs first, so the reservation
    spans few nodes; ties by name and index."""
    taken: set[tuple[str, int]] = set()
    for other in state.reservations.values():
        if other.name != besides and other.overlaps(start, end):
            taken.update(other.gpus)
    by_node: dict[str, list[int]] = {}
    for name, node in sorted(state.nodes.items()):
        if node.phase != "ready" or node.cordoned:
            continue
        free = [
            index
            for index, gpu in sorted(node.gpus.items())
            if (not ask.models or gpu.model in ask.models)
            and (ask.pool == "any" or gpu.pool == ask.pool)
            and (name, index) not in taken
        ]
        if free and not ignore_jobs:
            busy = set(jobs_holding_at(state, {(name, i) for i in free}, start, besides=besides))
            held = {
                (p.node, p.index)
                for job_id in busy
                for _, r in state.jobs[job_id].held_replicas()
                for p in r.slices
            }
            free = [i for i in free if (name, i) not in held]
        if free:
            by_node[name] = free
    domains: dict[str, list[str]] = {}
    for name in by_node:
        domain = state.nodes[name].spec.domain(ask.level) if ask.level is not None else ""
        if domain is not None:
            domains.setdefault(domain, []).append(name)
    fitting = sorted(
        (sum(len(by_node[n]) for n in names), domain)
        for domain, names in domains.items()
        if sum(len(by_node[n]) for n in names) >= ask.count
    )
    if not fitting:
        where = f"one {ask.level} domain" if ask.level is not None else "the cluster"
        most = max((sum(len(by_node[n]) for n in ns) for ns in domains.values()), default=0)
        return (
            f"{ask.count} GPU(s) asked; {where} has at most {most} that match and are free "
            "of other reservations and running jobs for the window"
        )
    chosen = sorted(domains[fitting[0][1]], key=lambda n: (-len(by_node[n]), n))
    gpus: list[tuple[str, int]] = []
    for name in chosen:
        for index in by_node[name]:
            if len(gpus) < ask.count:
                gpus.append((name, index))
    return sorted(gpus)

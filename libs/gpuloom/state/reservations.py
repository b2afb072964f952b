"""The rules of advance reservations that more than one process asks (docs/reservations.md).

- `reservation_problem`: why a reservation cannot be made (or changed) as the log stands:
  a GPU that does not exist, another reservation on one of its GPUs at an overlapping
  time, or running jobs that will still hold one of its GPUs at its start (unless
  `ignore_jobs`). The fold voids such an event with this reason; the gateway answers it
  (409 naming the jobs); its choice of GPUs avoids them.
- `placement_refusal`: why a recorded placement breaks a reservation: a job of a
  reservation outside its GPUs or its time, or another job on the GPUs of a reservation
  that has started. (Whether a job placed before the start ends in time is judged by
  placement on the log's time of the pass: `gpuloom.placement.fences`.)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta

from gpuloom.events.placement import ReplicaAssignment
from gpuloom.events.reservations import ReservationSpec
from gpuloom.state.model import ClusterState, JobState
from gpuloom.state.tenancy import AdvanceReservation

#: The most job ids one refusal names.
NAMED_MAX = 10


def folded(name: str, spec: ReservationSpec, *, started: bool = False) -> AdvanceReservation:
    """The reservation as the state keeps it."""
    return AdvanceReservation(
        name=name,
        start=spec.start,
        end=spec.end,
        gpus=tuple((g.node, g.index) for g in spec.gpus),
        users=tuple(spec.users),
        accounts=tuple(spec.accounts),
        maint=spec.maint,
        ignore_jobs=spec.ignore_jobs,
        description=spec.description,
        started=started,
    )


def reservation_problem(state: ClusterState, wanted: AdvanceReservation) -> str | None:
    """Why `wanted` cannot be made as the state stands (any other reservation of its name
    aside, so that an update is checked against the rest), or None."""
    for node_name, index in wanted.gpus:
        node = state.nodes.get(node_name)
        if node is None or index not in node.gpus:
            return f"node {node_name} has no GPU {index}"
    gpus = set(wanted.gpus)
    for other in sorted(state.reservations.values(), key=lambda r: r.name):
        if other.name == wanted.name or not other.overlaps(wanted.start, wanted.end):
            continue
        shared = sorted(gpus.intersection(other.gpus))
        if shared:
            return (
                f"{_gpu_names(shared)} are in reservation {other.name} from "
                f"{other.start.isoformat()} to {other.end.isoformat()}"
            )
    if wanted.ignore_jobs:
        return None
    holding = jobs_holding_at(state, gpus, wanted.start, besides=wanted.name)
    if holding:
        named = ", ".join(holding[:NAMED_MAX]) + (" ..." if len(holding) > NAMED_MAX else "")
        return (
            f"running job(s) {named} will still hold its GPUs at its start "
            "(their time limits end later, or they have none); flag ignore_jobs to make it anyway"
        )
    return None


def jobs_holding_at(
    state: ClusterState, gpus: set[tuple[str, int]], moment: datetime, *, besides: str = ""
) -> list[str]:
    """The placed and running jobs on `gpus` that may still hold them at `moment` (their
    time limit ends later, or they have none), jobs of reservation `besides` aside."""
    found: set[str] = set()
    for node_name in sorted({name for name, _ in gpus}):
        for job_id in sorted(state.on_node.get(node_name, ())):
            job = state.jobs.get(job_id)
            if job is None or job_id in found or (besides and job.spec.reservation == besides):
                continue
            if _holds_any((r for _, r in job.held_replicas()), gpus) and _may_hold_at(job, moment):
                found.add(job_id)
    return sorted(found)


def placement_refusal(
    state: ClusterState, job: JobState, replicas: Sequence[ReplicaAssignment], at: datetime
) -> str | None:
    """Why this placement of `job`, recorded at `at`, breaks a reservation, or None."""
    used = {(piece.node, piece.index) for replica in replicas for piece in replica.slices}
    name = job.spec.reservation
    if name is not None:
        own = state.reservations.get(name)
        if own is None:
            return f"reservation {name} does not exist (any more)"
        if not own.started:
            return f"reservation {name} has not started"
        outside = sorted(used.difference(own.gpus))
        if outside:
            return f"{_gpu_names(outside)} are not in reservation {name}"
        return None
    for other in sorted(state.reservations.values(), key=lambda r: r.name):
        if other.started and other.end > at:
            taken = sorted(used.intersection(other.gpus))
            if taken:
                return f"{_gpu_names(taken)} are held by reservation {other.name}"
    return None


def _holds_any(replicas: Iterable[ReplicaAssignment], gpus: set[tuple[str, int]]) -> bool:
    return any((p.node, p.index) in gpus for replica in replicas for p in replica.slices)


def _may_hold_at(job: JobState, moment: datetime) -> bool:
    limit = job.spec.time_limit_s
    run = job.current_run()
    began = run.started_at if run is not None else job.placed_at
    if limit is None or began is None:
        return True
    return began + timedelta(seconds=limit) > moment


def _gpu_names(gpus: Sequence[tuple[str, int]]) -> str:
    shown = ", ".join(f"{node}/{index}" for node, index in gpus[:NAMED_MAX])
    more = f" and {len(gpus) - NAMED_MAX} more" if len(gpus) > NAMED_MAX else ""
    return f"GPU(s) {shown}{more}"

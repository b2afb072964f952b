"""The one reservation of a pass (EASY backfill): when the first blocked job could
start, what it would take then, and what a job that may outlast that start may still
take of the reserved resources.

`find_reservation` lets running jobs end in the order of their time limits (those
without one last) on a scratch copy of the views until the job fits; the slack of
each reserved GPU and host is what is left of it once the reserved job has taken its
share then. `explain` asks the same search for its estimate (`cycle.earliest_start`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuloom.placement.candidate import Candidate
from gpuloom.placement.engine import Context, NodeIndex, Policy, release
from gpuloom.placement.fences import Fences
from gpuloom.placement.holdings import HeldSum, Holding, release_all, scratch
from gpuloom.placement.resources import Placement, ReplicaPlacement, fits_locally
from gpuloom.placement.topology import place


@dataclass(frozen=True, slots=True)
class Reservation:
    """`job_id` is to start at `start_at` (None: once jobs without time limits end) there."""

    job_id: str
    start_at: int | None
    replicas: tuple[ReplicaPlacement, ...]


@dataclass
class Protection:
    """What a job that may outlast the reservation may take of each reserved resource.

    The slack of a GPU or host is what it will have free at the reservation's
    start once the reserved job has taken its part; long jobs placed meanwhile
    use it up.
    """

    gpu_slack: dict[tuple[str, int], list[int]] = field(default_factory=dict)
    host_slack: dict[str, list[int | None]] = field(default_factory=dict)

    def apply(self, index: NodeIndex) -> dict[object, tuple[int | None, ...]]:
        """Cap the reserved resources at their slack; the values before, to restore."""
        saved: dict[object, tuple[int | None, ...]] = {}
        for (name, number), (milli, memory) in sorted(self.gpu_slack.items()):
            gpu = next(g for g in index.nodes[name].gpus if g.index == number)
            saved[(name, number)] = (gpu.milli_free, gpu.memory_free_mib)
            gpu.milli_free = min(gpu.milli_free, milli)
            gpu.memory_free_mib = min(gpu.memory_free_mib, memory)
        for name, (cpu, host_memory) in sorted(self.host_slack.items()):
            node = index.nodes[name]
            saved[name] = (node.cpu_free_milli, node.memory_free_mib)
            if node.cpu_free_milli is not None and cpu is not None:
                node.cpu_free_milli = min(node.cpu_free_milli, cpu)
            if node.memory_free_mib is not None and host_memory is not None:
                node.memory_free_mib = min(node.memory_free_mib, host_memory)
        self._touch(index)
        return saved

    def restore(self, index: NodeIndex, saved: dict[object, tuple[int | None, ...]]) -> None:
        """Undo `apply`, keeping (and charging to the slack) what was taken meanwhile."""
        for key, slack in sorted(self.gpu_slack.items()):
            name, number = key
            gpu = next(g for g in index.nodes[name].gpus if g.index == number)
            milli, memory = saved[key]
            assert milli is not None and memory is not None
            capped_milli, capped_memory = min(milli, slack[0]), min(memory, slack[1])
            taken_milli = capped_milli - gpu.milli_free
            taken_memory = capped_memory - gpu.memory_free_mib
            gpu.milli_free = milli - taken_milli
            gpu.memory_free_mib = memory - taken_memory
            slack[0] -= taken_milli
            slack[1] -= taken_memory
        for name, host_slack in sorted(self.host_slack.items()):
            node = index.nodes[name]
            cpu, memory = saved[name]
            if cpu is not None and node.cpu_free_milli is not None and host_slack[0] is not None:
                taken = min(cpu, host_slack[0]) - node.cpu_free_milli
                node.cpu_free_milli = cpu - taken
                host_slack[0] -= taken
            if (
                memory is not None
                and node.memory_free_mib is not None
                and host_slack[1] is not None
            ):
                taken = min(memory, host_slack[1]) - node.memory_free_mib
                node.memory_free_mib = memory - taken
                host_slack[1] -= taken
        self._touch(index)

    def _touch(self, index: NodeIndex) -> None:
        names = {name for name, _ in self.gpu_slack} | set(self.host_slack)
        for name in sorted(names):
            node = index.nodes[name]
            node.forget()
            index.update(node)


def _end_order(holding: Holding) -> tuple[bool, int, int, str]:
    return (holding.ends_at is None, holding.ends_at or 0, holding.order, holding.job_id)


def _end_groups(holdings: Iterable[Holding]) -> list[list[Holding]]:
    """Holdings grouped by when they end, earliest first; those without a limit last."""
    groups: list[list[Holding]] = []
    for holding in sorted(holdings, key=_end_order):
        if groups and groups[-1][0].ends_at == holding.ends_at:
            groups[-1].append(holding)
        else:
            groups.append([holding])
    return groups


def find_reservation(
    candidate: Candidate,
    index: NodeIndex,
    holdings: Sequence[Holding],
    policy: Policy,
    context: Context,
    unbounded: HeldSum | None = None,
    released: NodeIndex | None = None,
    *,
    fences: Fences | None = None,
) -> tuple[Reservation, Protection] | None:
    """The earliest start of `candidate` as running jobs end, and the slack it leaves.

    None when it would not fit even with every running job gone (it waits for
    a node to come back, say). The search runs on a scratch copy of the views.
    `unbounded`: more running jobs, without a time limit, summed (`HeldSum`); they
    end last, with those of `holdings` that have no limit. `released`: the views with
    all of them given back (`gpuloom.placement.incremental.released`), for the last step; it is
    left as it was found. `fences`: the advance reservations' GPUs, hidden again wherever
    jobs give them back (`Fences.hide_on`, `Fences.hidden_in`): the blocked job is outside
    them.
    """
    views, request = index, candidate.request
    simple = request.replicas == 1 and (request.locality == "local-only" or request.gpus == 0)
    groups: list[tuple[list[Holding], HeldSum | None]] = [
        (group, None) for group in _end_groups(holdings)
    ]
    if unbounded is not None and (unbounded.local or unbounded.spanning):
        if groups and groups[-1][0][0].ends_at is None:
            groups[-1] = (groups[-1][0], unbounded)
        else:
            groups.append(([], unbounded))
    copy: NodeIndex | None = None  # made at the first step it takes
    for step, (group, summed) in enumerate(groups):
        if released is not None and step == len(groups) - 1:
            if fences is None:
                return _last_step(candidate, released, group, summed, policy, context)
            with fences.hidden_in(released):
                return _last_step(candidate, released, group, summed, policy, context)
        if copy is None:
            copy = scratch(views)
        touched = release_all(copy, group, summed)
        if fences is not None:
            fences.hide_on(copy, touched)
        if simple and not any(fits_locally(request, copy.nodes[n]) for n in sorted(touched)):
            continue
        placement = place(request, copy, policy, context)
        if placement is None:
            continue
        ends_at = group[0].ends_at if group else None  # only the summed group has none
        reservation = Reservation(candidate.job_id, ends_at, placement.replicas)
        return reservation, _slack_after(copy, placement)
    return None


def _last_step(
    candidate: Candidate,
    released: NodeIndex,
    group: list[Holding],
    summed: HeldSum | None,
    policy: Policy,
    context: Context,
) -> tuple[Reservation, Protection] | None:
    """The search's last step on the views with everything given back (`released`): what
    it finds there when `group` and `summed`, the last to end, have ended. The nodes
    they free are those `release_all` would touch (every replica is on its host here)."""
    request = candidate.request
    nodes = released.nodes
    if request.replicas == 1 and (request.locality == "local-only" or request.gpus == 0):
        touched = {r.host for holding in group for r in holding.replicas if r.host in nodes}
        if summed is not None:
            touched.update(name for name in summed.local if name in nodes)
        if not any(fits_locally(request, nodes[n]) for n in sorted(touched)):
            return None
    placement = place(request, released, policy, context)
    if placement is None:
        return None
    try:
        ends_at = group[0].ends_at if group else None
        reservation = Reservation(candidate.job_id, ends_at, placement.replicas)
        return reservation, _slack_after(released, placement)
    finally:
        for replica in reversed(placement.replicas):
            release(released, replica)


def _slack_after(index: NodeIndex, placement: Placement) -> Protection:
    protection = Protection()
    for replica in placement.replicas:
        for piece in replica.slices:
            gpu = next(g for g in index.nodes[piece.node].gpus if g.index == piece.index)
            protection.gpu_slack[(piece.node, piece.index)] = [gpu.milli_free, gpu.memory_free_mib]
        host = index.nodes[replica.host]
        protection.host_slack[replica.host] = [host.cpu_free_milli, host.memory_free_mib]
    return protection


def must_leave_slack(
    candidate: Candidate,
    reservation: Reservation | None,
    protection: Protection | None,
    now: int,
) -> bool:
    """Whether the candidate must leave the reservation's slack alone: a reservation
    exists and the job may run past its start."""
    if reservation is None or protection is None:
        return False
    limit = candidate.time_limit_s
    ends_before = (
        limit is not None
        and reservation.start_at is not None
        and now + 1000 * limit <= reservation.start_at
    )
    return not ends_before


def try_place(
    candidate: Candidate,
    index: NodeIndex,
    policy: Policy,
    context: Context,
    protection: Protection | None,
) -> Placement | None:
    """Place the candidate; with `protection`, within the reservation's slack."""
    if protection is None:
        return place(candidate.request, index, policy, context)
    saved = protection.apply(index)
    try:
        return place(candidate.request, index, policy, context)
    finally:
        protection.restore(index, saved)

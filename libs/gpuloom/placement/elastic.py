"""Elastic gangs in a scheduling pass (`JobSpec.min_replicas`, docs/distributed.md).

The pass sees an elastic gang as a gang of its minimum: that is what its quotas, its
reservation, its preemptions and why it waits are about. What it takes beyond is
taken only where nothing ahead is left waiting, one replica at a time, each within
its quotas and inside its domain when its topology is required:

* at its start, once its minimum is placed and no job ahead of it is blocked
  (`more_replicas`);
* while it runs, at the end of a pass that blocked no job (`Growth`, `Grown`): the
  GPUs of a cluster with an empty queue go to the running gangs, in their order.

It gives back what it took beyond its minimum before it is stopped: a preemption's
victims are searched first among the gangs' replicas, each a victim of its own, as many
of a gang as it has past its minimum (`shrink_units`, `within_surplus`), so a gang
shrinks instead of dying when that is enough.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from gpuloom.placement.engine import Context, NodeIndex, Policy, release
from gpuloom.placement.holdings import Holding
from gpuloom.placement.resources import ReplicaPlacement, Request
from gpuloom.placement.topology import place

#: Whether the replicas a job would take beyond what its quotas already hold fit them.
FitsQuota = Callable[[Sequence[ReplicaPlacement]], bool]


@dataclass(frozen=True, slots=True)
class Growth:
    """A running elastic gang that may take `missing` more replicas, numbered from
    `first`: each asks `request` (one replica, inside its domain when required)."""

    job_id: str
    request: Request
    missing: int
    first: int
    account: str
    user: str
    #: What one replica takes of the quota resources known before placement.
    unit: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class Grown:
    """Running gang `job_id` takes `replicas`, numbered from `first` (a JobGrown)."""

    job_id: str
    replicas: tuple[ReplicaPlacement, ...]
    first: int
    position: int


def one_more(request: Request, domain: tuple[str, str] | None) -> Request:
    """What one more replica of `request` asks: kept within `domain` (the gang's, when its
    topology is required), anywhere otherwise."""
    return replace(request, replicas=1, topology=None, within=domain)


def gang_domain(request: Request, index: NodeIndex, host: str) -> tuple[str, str] | None:
    """The domain the gang hosted first on `host` must keep to (its topology required)."""
    ask = request.topology
    if ask is None or ask[1] != "required":
        return None
    node = index.nodes.get(host)
    domain = node.topology.get(ask[0]) if node is not None else None
    return (ask[0], domain) if domain is not None else None


def more_replicas(
    request: Request,
    most: int,
    index: NodeIndex,
    policy: Policy,
    context: Context,
    fits_quota: FitsQuota,
) -> tuple[list[ReplicaPlacement], bool]:
    """Up to `most` replicas of `request` (one replica's ask), placed one at a time on
    `index` while they fit it and `fits_quota` (given all of them so far); and whether
    it stopped because no node had room for one more."""
    added: list[ReplicaPlacement] = []
    while len(added) < most:
        placement = place(request, index, policy, context)
        if placement is None:
            return added, True
        replica = placement.replicas[0]
        if not fits_quota([*added, replica]):
            release(index, replica)
            break
        added.append(replica)
    return added, False


def scaled(unit: Mapping[str, int], replicas: int) -> dict[str, int]:
    """What `replicas` replicas take of the quota resources one takes `unit` of."""
    return {resource: amount * replicas for resource, amount in unit.items()}


def per_replica(demand: Mapping[str, int], replicas: int) -> dict[str, int]:
    """What one of `replicas` replicas takes of `demand` (it is linear in them)."""
    return {resource: amount // replicas for resource, amount in demand.items()}


def shrink_units(holdings: Sequence[Holding]) -> list[Holding]:
    """The replicas preemption may take from the running elastic gangs (`keep` set) of
    `holdings` without stopping them: each replica but replica 0 (which holds the
    rendezvous), a victim of its own (`shrink`). How many of one gang it may take is
    `within_surplus`'s to say."""
    units: list[Holding] = []
    for holding in holdings:
        if not holding.keep or len(holding.replicas) <= holding.keep or holding.stopping:
            continue
        units.extend(
            replace(holding, replicas=(replica,), numbers=(number,), keep=0, shrink=True)
            for position, replica in enumerate(holding.replicas)
            if (number := holding.number(position)) != 0
        )
    return units


def within_surplus(victims: Sequence[Holding], holdings: Sequence[Holding]) -> bool:
    """Whether `victims` (shrink units) leave each gang at least the replicas it keeps."""
    taken: dict[str, int] = {}
    for victim in victims:
        taken[victim.job_id] = taken.get(victim.job_id, 0) + len(victim.replicas)
    surplus = {h.job_id: len(h.replicas) - h.keep for h in holdings if h.keep}
    return all(count <= surplus.get(job_id, 0) for job_id, count in taken.items())


def merged_victims(victims: Sequence[Holding]) -> tuple[Holding, ...]:
    """The replicas chosen of each gang merged into one holding: one JobShrunk per gang."""
    merged: dict[str, Holding] = {}
    for victim in victims:
        was = merged.get(victim.job_id)
        if was is None:
            merged[victim.job_id] = victim
        else:
            merged[victim.job_id] = replace(
                was,
                replicas=(*was.replicas, *victim.replicas),
                numbers=(*was.numbers, *victim.numbers),
            )
    return tuple(merged.values())


def after_shrink(holding: Holding, leaving: Holding, now: int) -> list[Holding]:
    """`holding` once the replicas of `leaving` are told to stop: what it keeps, and
    those replicas ending `now`."""
    gone = set(leaving.numbers)
    pairs = [(holding.number(i), r) for i, r in enumerate(holding.replicas)]
    kept = [(n, r) for n, r in pairs if n not in gone]
    return [
        replace(
            holding,
            replicas=tuple(r for _, r in kept),
            numbers=tuple(n for n, _ in kept),
            keep=0,
        ),
        replace(leaving, stopping=True, ends_at=now, keep=0),
    ]

"""Placing a job with a topology request: its replicas inside one domain of a level, or
in as few domains as placement can (docs/topology.md).

`place` is what the scheduler, admission, preemption and the reservation search ask: the
engine's `place` for a job without a topology request; for one with, the engine's
`place` once per domain it tries, kept within that domain (`Request.within`: a node
outside it neither hosts a replica nor lends it a slice).

- **required** (`level`): the domains of `level` are tried in order, the first that
  takes every replica wins; none: the job waits (`topology_shortfall` says what each
  domain lacks).
- **preferred**: the same at `level`, then at each looser level; then anywhere, each
  replica in the domain of `level` with the most room first, so it spans few domains.

A job of one replica whose GPUs are all on its host is inside one domain of every level
wherever it lands: the policy places it as any other job (trying the domains one by one
would cost every node once per domain, for nothing).

Which domain, among those that fit, for a gang: the one with the **fewest GPUs that could serve the
request** (free now, of its model and pool), ties to the name. A gang goes where it fits
most tightly and leaves the emptiest domains whole for the larger gangs that need them,
as best-fit does for nodes (Kueue's default for required topology is the same idea,
minimising fragmentation).
"""

from __future__ import annotations

from dataclasses import replace

from gpuloom.placement.engine import Context, NodeIndex, Policy, release
from gpuloom.placement.engine import place as place_anywhere
from gpuloom.placement.resources import NodeView, Placement, Request, serving_gpus


def place(request: Request, index: NodeIndex, policy: Policy, context: Context) -> Placement | None:
    """Place all replicas of `request` (a gang: all or none), honouring its topology."""
    ask = request.topology
    if ask is None or request.within is not None:
        return place_anywhere(request, index, policy, context)
    if request.replicas == 1 and (request.locality == "local-only" or request.gpus == 0):
        # one replica on its own node is inside one domain of every level: the policy
        # alone chooses (trying each domain would cost every node once per domain)
        return place_anywhere(replace(request, topology=None), index, policy, context)
    level, mode = ask
    for tried in (level, *looser_levels(index, level)) if mode == "preferred" else (level,):
        placement = _in_one_domain(request, index, policy, context, tried)
        if placement is not None:
            return placement
    if mode == "required":
        return None
    return _in_few_domains(request, index, policy, context, level)


def domains(index: NodeIndex, level: str) -> dict[str, list[NodeView]]:
    """The nodes of each domain of `level`, by domain name (nodes without it left out)."""
    nodes = index.nodes
    return {d: [nodes[n] for n in names] for d, names in index.domains_of(level).items()}


def domain_room(request: Request, index: NodeIndex, level: str) -> dict[str, int]:
    """GPUs that could give one slice of `request` now, per domain of `level`. Kept on the
    index until a view changes (`NodeIndex.version`): it depends only on what the request
    asks of a GPU, so the gangs of a queue that differ in CPU or memory, and the same gang
    asked again, share it (every gang waiting for room counts every node otherwise)."""
    key = ("domain_room", level, request.models, request.pool, request.gpu_milli,
           request.gpu_memory_mib, request.fractional)  # fmt: skip
    kept = index.memo.get(key)
    if kept is not None and kept[0] == index.version:
        return kept[1]  # type: ignore[return-value]
    room = {d: serving_count(request, nodes, index) for d, nodes in domains(index, level).items()}
    if len(index.memo) >= MEMO_MAX:
        index.memo.clear()
    index.memo[key] = (index.version, room)
    return room


#: Results kept on an index at most (`domain_room`).
MEMO_MAX = 256


def looser_levels(index: NodeIndex, level: str) -> list[str]:
    """The levels after `level` in the nodes' order (tightest first), as the first node
    that names `level` gives them."""
    for node in sorted(index.nodes.values(), key=lambda n: n.rank):
        names = list(node.topology)
        if level in names:
            return names[names.index(level) + 1 :]
    return []


def serving_count(request: Request, nodes: list[NodeView], index: NodeIndex | None = None) -> int:
    """GPUs of `nodes` that could give one slice of `request` now. With the `index` of the
    nodes, each group of nodes in the same state is counted once (`NodeIndex.group_of`):
    a gang asks it of every node of the cluster, for each shape it tries."""
    if index is None:
        return sum(len(serving_gpus(request, node)) for node in nodes)
    counted: dict[int, int] = {}
    total = 0
    for node in nodes:
        group = index.group_of(node)
        count = counted.get(group)
        if count is None:
            count = counted[group] = len(serving_gpus(request, node))
        total += count
    return total


def topology_shortfall(request: Request, index: NodeIndex, level: str) -> str:
    """What each domain of `level` lacks for the whole job, for its pending reason:
    "no rack has 8 free GPUs for it: r1 has 6, r2 has 4"."""
    need = request.gpus * request.replicas
    found = domains(index, level)
    if not found:
        return f"no node names a {level} (docs/topology.md)"
    counts = sorted(
        ((count, domain) for domain, count in domain_room(request, index, level).items()),
        key=lambda pair: (-pair[0], pair[1]),
    )
    have = ", ".join(f"{d} has {count}" for count, d in counts[:SHORTFALL_NAMED])
    more = len(counts) - SHORTFALL_NAMED
    return f"no {level} has {need} free GPU(s) for it: {have}" + (
        f" (and {more} more with fewer)" if more > 0 else ""
    )


#: The domains a `Topology` reason names, the roomiest first.
SHORTFALL_NAMED = 8


def _in_one_domain(
    request: Request, index: NodeIndex, policy: Policy, context: Context, level: str
) -> Placement | None:
    need = request.gpus * request.replicas
    fitting = [
        (count, domain)
        for domain, count in domain_room(request, index, level).items()
        if count >= need
    ]
    for _, domain in sorted(fitting):
        placement = place_anywhere(replace(request, within=(level, domain)), index, policy, context)
        if placement is not None:
            return placement
    return None


def _in_few_domains(
    request: Request, index: NodeIndex, policy: Policy, context: Context, level: str
) -> Placement | None:
    """Replica by replica, each in the domain with the most room first (the fewest
    domains for the gang), then anywhere; all or none."""
    placed: list[Placement] = []
    one = replace(request, replicas=1)
    for _ in range(request.replicas):
        ranked = sorted(
            (
                (-serving_count(one, nodes), domain)
                for domain, nodes in domains(index, level).items()
            )
        )
        replica = None
        for _, domain in ranked:
            replica = place_anywhere(replace(one, within=(level, domain)), index, policy, context)
            if replica is not None:
                break
        if replica is None:
            replica = place_anywhere(replace(one, topology=None), index, policy, context)
        if replica is None:
            for done in reversed(placed):
                for part in reversed(done.replicas):
                    release(index, part)
            return None
        placed.append(replica)
    return Placement(tuple(r for p in placed for r in p.replicas))

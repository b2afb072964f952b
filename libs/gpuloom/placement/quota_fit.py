"""Model and pool quotas in a pass: they depend on where a job lands, so the request
is narrowed to the models and pools its account's quotas admit before it is placed,
and what it took is charged to each afterwards."""

from __future__ import annotations

from dataclasses import replace

from gpuloom.events.accounts import depends_on_where, model_resource, pool_resource
from gpuloom.placement.candidate import Candidate
from gpuloom.placement.engine import NodeIndex
from gpuloom.placement.resources import Placement
from gpuloom.queueing.quota import QuotaBook

#: The cluster's GPU models and pools, or () when no model or pool quota exists.
Where = tuple[tuple[str, ...], tuple[str, ...]] | tuple[()]


def where_limited(index: NodeIndex, quotas: QuotaBook) -> Where:
    """The GPU models and pools of the cluster, when some model or pool quota exists."""
    if not any(depends_on_where(r) for r in quotas.trackers):
        return ()
    models = sorted({g.model for n in index.nodes.values() for g in n.gpus})
    return (tuple(models), ("physical", "vgpu"))


def within_quota(
    candidate: Candidate,
    quotas: QuotaBook,
    where: Where,
) -> Candidate | str:
    """The candidate restricted to the models and pools its account's quotas admit, or
    why none is (the first model's or pool's refusal).

    Model and pool quotas depend on where a job lands, so instead of placing it and
    checking afterwards, the request is narrowed to what the quotas allow; what it then
    takes is charged to each after placement. A model and a pool are admitted each on
    its own: a job may land on any admitted model in any admitted pool.
    """
    request = candidate.request
    milli = request.gpu_demand_milli * request.replicas
    if not milli or not where:
        return candidate
    models, pools = where
    wanted = request.models or models
    allowed = tuple(
        m for m in wanted if quotas.why_not(candidate.account, {model_resource(m): milli}) is None
    )
    pool_choices = (
        ("vgpu",) if request.fractional else (pools if request.pool == "any" else (request.pool,))
    )
    open_pools = [
        p
        for p in pool_choices
        if quotas.why_not(candidate.account, {pool_resource(p): milli}) is None
    ]
    if not allowed:
        first = {model_resource(wanted[0]): milli} if wanted else {}
        refusal = quotas.why_not(candidate.account, first) if first else None
        return refusal or "QuotaExceeded: no GPU model it may use has room in its quotas"
    if not open_pools:
        refusal = quotas.why_not(candidate.account, {pool_resource(pool_choices[0]): milli})
        return refusal or "QuotaExceeded: no pool it may use has room in its quotas"
    pool = request.pool if len(open_pools) == len(pool_choices) else open_pools[0]
    if allowed == tuple(request.models) and pool == request.pool:
        return candidate
    narrowed = replace(
        request,
        models=allowed if len(allowed) < len(models) or request.models else (),
        pool=pool,  # type: ignore[arg-type]
    )
    return replace(candidate, request=narrowed)


def where_demand(index: NodeIndex, placement: Placement) -> dict[str, int]:
    """Milli-GPU of the placement per GPU model and per pool (`model:<m>`, `pool:<p>`)."""
    demand: dict[str, int] = {}
    for replica in placement.replicas:
        for piece in replica.slices:
            gpu = next(g for g in index.nodes[piece.node].gpus if g.index == piece.index)
            for key in (model_resource(gpu.model), pool_resource(gpu.pool)):
                demand[key] = demand.get(key, 0) + piece.milli
    return demand

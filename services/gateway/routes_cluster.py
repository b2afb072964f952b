"""/v1/nodes, /v1/queue, /v1/audit, /v1/schemas/events, and /healthz (on `public`).

Any authenticated user reads nodes, the queue and the audit (as `sinfo`, `squeue`,
`sprio`); pools and cordons are the operators'. Their writes are commands that return
their refusal, which the route answers (`refusals.answer`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query
from pydantic import BaseModel
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from gpuloom.auth import Principal
from gpuloom.events import (
    Event,
    GpuPoolChanged,
    NodeCordoned,
    NodeRemoved,
    NodeUncordoned,
    json_schemas,
)
from gpuloom.events.text import Remark
from gpuloom.queueing.order import (
    pending_in_order,
    priority_weights,
    yields_to,
)
from gpuloom.queueing.priority import FACTOR_SCALE
from gpuloom.state.dependencies import dependency_status
from gpuloom.state.rules.nodes import pool_change_problem, removal_problem
from gpuloom.store.models import NodeRow
from services.gateway.auth import PrincipalDep, operator
from services.gateway.deps import Gateway, GatewayDep, NodeName, SessionDep
from services.gateway.publish import publish
from services.gateway.refusals import Refused, answer, not_found
from services.gateway.responses import UNAVAILABLE
from services.gateway.schemas import (
    AuditView,
    Health,
    Node,
    NodeList,
    NodeRemovedAnswer,
    PoolChangeAccepted,
    Problem,
    Queue,
    QueuedJob,
)

router = APIRouter()
#: Routes that answer without a token (a liveness probe has none).
public = APIRouter()


@router.get("/v1/nodes", response_model=NodeList, tags=["nodes"])
async def list_nodes(gateway: GatewayDep, session: SessionDep, principal: PrincipalDep) -> NodeList:
    await gateway.catch_up(principal.name)
    rows = await session.scalars(
        select(NodeRow).where(NodeRow.state != REMOVED).order_by(NodeRow.name)
    )
    return NodeList(nodes=[Node.model_validate(row, from_attributes=True) for row in rows])


#: The state of a removed node's last row (NodeRemoved): it is no longer listed.
REMOVED = "removed"


class PoolChange(BaseModel):
    pool: Literal["physical", "vgpu"]


@router.post(
    "/v1/nodes/{node}/gpus/{gpu}/pool",
    status_code=202,
    response_model=PoolChangeAccepted,
    tags=["nodes"],
    responses={404: {"model": Problem}, 409: {"model": Problem}},
    dependencies=[Depends(operator("move GPUs between pools"))],
)
async def change_pool(
    node: NodeName,
    gpu: Annotated[int, Path(ge=0, le=1023)],
    change: PoolChange,
    gateway: GatewayDep,
    session: SessionDep,
    principal: PrincipalDep,
) -> PoolChangeAccepted:
    """Move an idle GPU to the physical or the vGPU pool (event GpuPoolChanged).

    A GPU with work on it is refused with 409; so is a change that the log voids
    because work landed on the GPU in between (the answer says so).
    """
    return answer(await _change_pool(gateway, session, node, gpu, change.pool, principal))


async def _change_pool(
    gateway: Gateway,
    session: AsyncSession,
    node: str,
    gpu: int,
    pool: Literal["physical", "vgpu"],
    principal: Principal,
) -> PoolChangeAccepted | Refused:
    await gateway.catch_up(principal.name)
    row = await session.get(NodeRow, node)
    if row is None:
        return not_found(f"node {node}")
    found = next((g for g in row.gpus if g["index"] == gpu), None)
    if found is None:
        return Refused(404, f"node {node} has no GPU {gpu}")
    event = GpuPoolChanged(node=node, index=gpu, pool=pool)
    if gateway.read_model is not None:  # the fold's own rule, on the gateway's fold
        problem = pool_change_problem(gateway.read_model.state, event)
        if problem is not None:
            return Refused(409, f"{problem}: it cannot change pool")
    if found.get("pool") == pool:
        return PoolChangeAccepted(node=node, gpu=gpu, pool=pool, seq=None)
    seq = await _write(gateway, event, principal)
    if isinstance(seq, Refused):
        return seq
    return PoolChangeAccepted(node=node, gpu=gpu, pool=pool, seq=seq)


async def _write(gateway: Gateway, event: Event, principal: Principal) -> int | Refused:
    """Write `event`: its sequence, or refused as the log refuses it, or 409 with the
    reason the log voided it (work landed on the node in between)."""
    recorded = await publish(gateway, event, principal=principal)
    if isinstance(recorded, Refused):
        return recorded
    voided = await gateway.voided_reason(recorded.seq)
    return Refused(409, voided) if voided is not None else recorded.seq


class Cordon(BaseModel):
    reason: Remark = ""


@router.post(
    "/v1/nodes/{node}/cordon",
    response_model=Node,
    tags=["nodes"],
    responses={404: {"model": Problem}, **UNAVAILABLE},
    dependencies=[Depends(operator("cordon nodes"))],
)
async def cordon(
    node: NodeName, body: Cordon, gateway: GatewayDep, session: SessionDep, principal: PrincipalDep
) -> Node:
    """Take the node out of placement (event NodeCordoned): what runs there stays."""
    answer(await _known_node(gateway, session, node, principal))
    answer(await publish(gateway, NodeCordoned(node=node, reason=body.reason), principal=principal))
    return await _node_after_write(gateway, session, node, principal)


@router.delete(
    "/v1/nodes/{node}/cordon",
    response_model=Node,
    tags=["nodes"],
    responses={404: {"model": Problem}, **UNAVAILABLE},
    dependencies=[Depends(operator("uncordon nodes"))],
)
async def uncordon(
    node: NodeName, gateway: GatewayDep, session: SessionDep, principal: PrincipalDep
) -> Node:
    """Give the node back to placement (event NodeUncordoned); a no-op if not cordoned."""
    row = answer(await _known_node(gateway, session, node, principal))
    if row.cordoned is not None:
        answer(await publish(gateway, NodeUncordoned(node=node), principal=principal))
    return await _node_after_write(gateway, session, node, principal)


@router.delete(
    "/v1/nodes/{node}",
    status_code=202,
    response_model=NodeRemovedAnswer,
    tags=["nodes"],
    responses={404: {"model": Problem}, 409: {"model": Problem}, **UNAVAILABLE},
    dependencies=[Depends(operator("remove nodes"))],
)
async def remove_node(
    node: NodeName,
    gateway: GatewayDep,
    session: SessionDep,
    principal: PrincipalDep,
    reason: Annotated[Remark, Query(description="Why (kept in the log).")] = "",
) -> NodeRemovedAnswer:
    """Remove a node gone for good (event NodeRemoved, which names who asked): it leaves
    the cluster and its listing. 409 while it holds a job: cancel or requeue those first
    (a lost node's jobs are requeued already). Its agent, back, would register it anew."""
    return answer(await _remove(gateway, session, node, reason, principal))


async def _remove(
    gateway: Gateway, session: AsyncSession, node: str, reason: str, principal: Principal
) -> NodeRemovedAnswer | Refused:
    known = await _known_node(gateway, session, node, principal)
    if isinstance(known, Refused):
        return known
    if gateway.read_model is not None:
        problem = removal_problem(gateway.read_model.state, node)
        if problem is not None:
            return Refused(409, problem)
    seq = await _write(gateway, NodeRemoved(node=node, reason=reason), principal)
    return seq if isinstance(seq, Refused) else NodeRemovedAnswer(node=node, seq=seq)


async def _known_node(
    gateway: Gateway, session: AsyncSession, node: str, principal: Principal
) -> NodeRow | Refused:
    await gateway.catch_up(principal.name)
    row = await session.get(NodeRow, node)
    if row is None or row.state == REMOVED:
        return not_found(f"node {node}")
    return row


async def _node_after_write(
    gateway: GatewayDep, session: SessionDep, node: str, principal: Principal
) -> Node:
    await gateway.catch_up(principal.name)
    session.expire_all()
    row = await session.get(NodeRow, node)
    assert row is not None
    return Node.model_validate(row, from_attributes=True)


@router.get("/v1/queue", response_model=Queue, tags=["queue"])
async def queue(gateway: GatewayDep, principal: PrincipalDep, limit: int = 1000) -> Queue:
    """Pending jobs in queue order with each priority factor (like Slurm's sprio)."""
    await gateway.catch_up(principal.name)
    if gateway.read_model is None:
        return Queue(weights={}, jobs=[])
    state = gateway.read_model.state
    weights = priority_weights(state)
    jobs = []
    for position, (job, factors) in enumerate(pending_in_order(state)[:limit], 1):
        reason = None
        if job.cancel_requested:
            reason = "Held: a cancel request is being carried out"
        elif job.spec.depends_on:
            reason = dependency_status(state, job.spec.depends_on)[1]
        elif (preemptor := yields_to(state, job)) is not None:
            reason = f"Yields to {preemptor}: preempted for it, it goes first"
        jobs.append(
            QueuedJob(
                position=position,
                id=job.job_id,
                user=job.spec.user,
                account=job.spec.account,
                priority=factors.priority,
                age=factors.age / FACTOR_SCALE,
                fair_share=factors.fair_share / FACTOR_SCALE,
                size=factors.size / FACTOR_SCALE,
                points=factors.total / FACTOR_SCALE,
                reason=reason,
            )
        )
    return Queue(
        weights={
            "age": weights.age,
            "fair_share": weights.fair_share,
            "size": weights.size,
            "max_age_s": weights.max_age_s,
        },
        jobs=jobs,
    )


@router.get("/v1/audit", response_model=AuditView, tags=["audit"])
async def last_audit(gateway: GatewayDep, principal: PrincipalDep) -> AuditView:
    """The latest `gpuloom audit` written to the log: decisions verified, mismatches."""
    await gateway.catch_up(principal.name)
    state = gateway.read_model.state if gateway.read_model is not None else None
    event = state.last_audit if state is not None else None
    if event is None:
        return AuditView(audited=False, log_seq=state.seq if state is not None else 0)
    return AuditView(
        audited=True,
        log_seq=state.seq if state is not None else 0,
        from_seq=event.from_seq,
        to_seq=event.to_seq,
        verified=event.verified,
        mismatch_count=event.mismatch_count,
        mismatches=event.mismatches,
        seconds=event.seconds,
    )


@router.get("/v1/schemas/events", tags=["schemas"])
async def event_schemas() -> dict[str, Any]:
    """JSON Schema of every event type in the log, for outside subscribers."""
    return json_schemas()


@public.get("/healthz", response_model=Health, tags=["health"])
async def healthz(gateway: GatewayDep) -> Health:
    nats_ok = gateway.bus is not None and gateway.bus.connected
    seq = gateway.read_model.written_seq if gateway.read_model else 0
    return Health(status="ok" if nats_ok else "degraded", nats=nats_ok, projection_seq=seq)

"""/v1/nodes, /v1/audit, /v1/schemas/events, /healthz."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel
from sqlalchemy import select

from gpuloom.events import GpuPoolChanged, json_schemas
from gpuloom.store.models import NodeRow
from services.gateway.deps import GatewayDep, SessionDep
from services.gateway.publish import publish
from services.gateway.schemas import (
    AuditView,
    Health,
    Node,
    NodeList,
    PoolChangeAccepted,
    Problem,
)

router = APIRouter()


@router.get("/v1/nodes", response_model=NodeList, tags=["nodes"])
async def list_nodes(gateway: GatewayDep, session: SessionDep) -> NodeList:
    await gateway.catch_up()
    rows = await session.scalars(select(NodeRow).order_by(NodeRow.name))
    return NodeList(nodes=[Node.model_validate(row, from_attributes=True) for row in rows])


class PoolChange(BaseModel):
    pool: Literal["physical", "vgpu"]


@router.post(
    "/v1/nodes/{node}/gpus/{gpu}/pool",
    status_code=202,
    response_model=PoolChangeAccepted,
    tags=["nodes"],
    responses={404: {"model": Problem}, 409: {"model": Problem}},
)
async def change_pool(
    node: str, gpu: int, change: PoolChange, gateway: GatewayDep, session: SessionDep
) -> PoolChangeAccepted:
    """Move an idle GPU to the physical or the vGPU pool (event GpuPoolChanged).

    A GPU with work on it is refused with 409; so is a change that the log voids
    because work landed on the GPU in between (the answer says so).
    """
    await gateway.catch_up()
    row = await session.get(NodeRow, node)
    if row is None:
        raise HTTPException(status_code=404, detail=f"node {node} not found")
    found = next((g for g in row.gpus if g["index"] == gpu), None)
    if found is None:
        raise HTTPException(status_code=404, detail=f"node {node} has no GPU {gpu}")
    if found.get("allocated"):
        holders = ", ".join(h["job_id"] for h in found.get("holders", [])) or found.get("job_id")
        raise HTTPException(
            status_code=409,
            detail=f"GPU {node}/{gpu} is in use by {holders}: it cannot change pool",
        )
    if found.get("pool") == change.pool:
        return PoolChangeAccepted(node=node, gpu=gpu, pool=change.pool, seq=None)
    recorded = await publish(gateway, GpuPoolChanged(node=node, index=gpu, pool=change.pool))
    voided = await gateway.voided_reason(recorded.seq)
    if voided is not None:
        raise HTTPException(status_code=409, detail=voided)
    return PoolChangeAccepted(node=node, gpu=gpu, pool=change.pool, seq=recorded.seq)


@router.get("/v1/audit", response_model=AuditView, tags=["audit"])
async def last_audit(gateway: GatewayDep) -> AuditView:
    """The latest `gpuloom audit` written to the log: decisions verified, mismatches."""
    await gateway.catch_up()
    state = gateway.projector.state if gateway.projector is not None else None
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


@router.get("/healthz", response_model=Health, tags=["health"])
async def healthz(gateway: GatewayDep) -> Health:
    nats_ok = gateway.bus is not None and gateway.bus.connected
    seq = gateway.projector.written_seq if gateway.projector else 0
    return Health(status="ok" if nats_ok else "degraded", nats=nats_ok, projection_seq=seq)

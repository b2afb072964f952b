"""/v1/nodes, /v1/usage, /v1/schemas/events, /healthz."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from sqlalchemy import func, select

from gpuloom.events import json_schemas
from gpuloom.store.models import NodeRow, UsageChargeRow
from services.gateway.deps import GatewayDep, SessionDep
from services.gateway.schemas import AccountUsage, Health, Node, NodeList, Usage, UserUsage

router = APIRouter()


@router.get("/v1/nodes", response_model=NodeList, tags=["nodes"])
async def list_nodes(gateway: GatewayDep, session: SessionDep) -> NodeList:
    await gateway.catch_up()
    rows = await session.scalars(select(NodeRow).order_by(NodeRow.name))
    return NodeList(nodes=[Node.model_validate(row, from_attributes=True) for row in rows])


@router.get("/v1/usage", response_model=Usage, tags=["usage"])
async def usage(session: SessionDep) -> Usage:
    """GPU-seconds charged per account and per user (from the accounting ledger)."""
    gpu_ms = func.sum(UsageChargeRow.gpu_milli_seconds)
    jobs = func.count(func.distinct(UsageChargeRow.job_id))
    accounts = await session.execute(
        select(UsageChargeRow.account, gpu_ms, jobs)
        .group_by(UsageChargeRow.account)
        .order_by(UsageChargeRow.account)
    )
    users = await session.execute(
        select(UsageChargeRow.user, UsageChargeRow.account, gpu_ms, jobs)
        .group_by(UsageChargeRow.user, UsageChargeRow.account)
        .order_by(UsageChargeRow.user, UsageChargeRow.account)
    )
    return Usage(
        accounts=[AccountUsage(account=a, gpu_seconds=ms / 1000, jobs=n) for a, ms, n in accounts],
        users=[
            UserUsage(user=u, account=a, gpu_seconds=ms / 1000, jobs=n) for u, a, ms, n in users
        ],
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

"""/v1/nodes, /v1/queue, /v1/audit, /v1/schemas/events, and /healthz (on `public`).

Any authenticated user reads nodes, the queue and the audit (as `sinfo`, `squeue`,
`sprio`); pools and cordons are the operators'. Their writes are commands that return
their refusal, which the route answers (`refusals.answer`)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Path, Query

from gpuloom.auth import Principal
from gpuloom.events import (
    Event,
    GpuHealthy,
    GpuPoolChanged,
    NodeCordoned,
    NodeRemoved,
    NodeUncordoned,
    json_schemas,
)
from gpuloom.events.text import Remark
from services.gateway.auth import PrincipalDep, operator
from services.gateway.bodies import Body
from services.gateway.deps import EventLogDep, NodeName, PublisherDep, ReadsDep
from services.gateway.publish import Publisher
from services.gateway.reads import Reads
from services.gateway.reads.cluster import NodeStanding
from services.gateway.refusals import Refused, answer, not_found
from services.gateway.responses import UNAVAILABLE
from services.gateway.schemas import (
    AuditView,
    GpuResumed,
    Health,
    Node,
    NodeList,
    NodeRemovedAnswer,
    PoolChangeAccepted,
    Problem,
    Queue,
)

router = APIRouter()
#: Routes that answer without a token (a liveness probe has none).
public = APIRouter()


@router.get("/v1/nodes", response_model=NodeList, tags=["nodes"])
async def list_nodes(reads: ReadsDep, principal: PrincipalDep) -> NodeList:
    await reads.catch_up(principal.name)
    return await reads.cluster.nodes()


class PoolChange(Body):
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
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
) -> PoolChangeAccepted:
    """Move an idle GPU to the physical or the vGPU pool (event GpuPoolChanged).

    A GPU with work on it is refused with 409; so is a change that the log voids
    because work landed on the GPU in between (the answer says so).
    """
    return answer(await _change_pool(publisher, reads, node, gpu, change.pool, principal))


async def _change_pool(
    publisher: Publisher,
    reads: Reads,
    node: str,
    gpu: int,
    pool: Literal["physical", "vgpu"],
    principal: Principal,
) -> PoolChangeAccepted | Refused:
    await reads.catch_up(principal.name)
    row = await reads.cluster.standing(node)
    if row is None:
        return not_found(f"node {node}")
    found = next((g for g in row.gpus if g["index"] == gpu), None)
    if found is None:
        return Refused(404, f"node {node} has no GPU {gpu}")
    event = GpuPoolChanged(node=node, index=gpu, pool=pool)
    problem = reads.cluster.pool_change_problem(event)  # the fold's own rule
    if problem is not None:
        return Refused(409, f"{problem}: it cannot change pool")
    if found.get("pool") == pool:
        return PoolChangeAccepted(node=node, gpu=gpu, pool=pool, seq=None)
    seq = await _write(publisher, reads, event, principal)
    if isinstance(seq, Refused):
        return seq
    return PoolChangeAccepted(node=node, gpu=gpu, pool=pool, seq=seq)


async def _write(
    publisher: Publisher, reads: Reads, event: Event, principal: Principal
) -> int | Refused:
    """Write `event`: its sequence, or refused as the log refuses it, or 409 with the
    reason the log voided it (work landed on the node in between)."""
    recorded = await publisher.publish(event, principal=principal)
    if isinstance(recorded, Refused):
        return recorded
    voided = await reads.voided_reason(recorded.seq)
    return Refused(409, voided) if voided is not None else recorded.seq


class Resume(Body):
    reason: Remark = ""


@router.post(
    "/v1/nodes/{node}/gpus/{gpu}/resume",
    status_code=202,
    response_model=GpuResumed,
    tags=["nodes"],
    responses={404: {"model": Problem}, 409: {"model": Problem}},
    dependencies=[Depends(operator("resume GPUs"))],
)
async def resume_gpu(
    node: NodeName,
    gpu: Annotated[int, Path(ge=0, le=1023)],
    body: Resume,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
) -> GpuResumed:
    """Return a GPU that failed a health check to service (event GpuHealthy, with who
    and why): placement uses it again. 404 for a GPU that does not exist, 409 for one
    in service."""
    return answer(await _resume(publisher, reads, node, gpu, body.reason, principal))


async def _resume(
    publisher: Publisher, reads: Reads, node: str, gpu: int, reason: str, principal: Principal
) -> GpuResumed | Refused:
    await reads.catch_up(principal.name)
    row = await reads.cluster.standing(node)
    if row is None or row.removed:
        return not_found(f"node {node}")
    if not any(found["index"] == gpu for found in row.gpus):
        return Refused(404, f"node {node} has no GPU {gpu}")
    problem = reads.cluster.resume_problem(node, gpu)  # the fold's own rule
    if problem is not None:
        return Refused(409, problem)
    event = GpuHealthy(node=node, index=gpu, reason=reason)
    seq = await _write(publisher, reads, event, principal)
    return seq if isinstance(seq, Refused) else GpuResumed(node=node, gpu=gpu, seq=seq)


class Cordon(Body):
    reason: Remark = ""


@router.post(
    "/v1/nodes/{node}/cordon",
    response_model=Node,
    tags=["nodes"],
    responses={404: {"model": Problem}, **UNAVAILABLE},
    dependencies=[Depends(operator("cordon nodes"))],
)
async def cordon(
    node: NodeName,
    body: Cordon,
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
) -> Node:
    """Take the node out of placement (event NodeCordoned): what runs there stays."""
    answer(await _known_node(reads, node, principal))
    answer(
        await publisher.publish(NodeCordoned(node=node, reason=body.reason), principal=principal)
    )
    return await _node_after_write(reads, node, principal)


@router.delete(
    "/v1/nodes/{node}/cordon",
    response_model=Node,
    tags=["nodes"],
    responses={404: {"model": Problem}, **UNAVAILABLE},
    dependencies=[Depends(operator("uncordon nodes"))],
)
async def uncordon(
    node: NodeName, publisher: PublisherDep, reads: ReadsDep, principal: PrincipalDep
) -> Node:
    """Give the node back to placement (event NodeUncordoned); a no-op if not cordoned."""
    row = answer(await _known_node(reads, node, principal))
    if row.cordoned is not None:
        answer(await publisher.publish(NodeUncordoned(node=node), principal=principal))
    return await _node_after_write(reads, node, principal)


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
    publisher: PublisherDep,
    reads: ReadsDep,
    principal: PrincipalDep,
    reason: Annotated[Remark, Query(description="Why (kept in the log).")] = "",
) -> NodeRemovedAnswer:
    """Remove a node gone for good (event NodeRemoved, which names who asked): it leaves
    the cluster and its listing. 409 while it holds a job: cancel or requeue those first
    (a lost node's jobs are requeued already). Its agent, back, would register it anew."""
    return answer(await _remove(publisher, reads, node, reason, principal))


async def _remove(
    publisher: Publisher, reads: Reads, node: str, reason: str, principal: Principal
) -> NodeRemovedAnswer | Refused:
    known = await _known_node(reads, node, principal)
    if isinstance(known, Refused):
        return known
    problem = reads.cluster.removal_problem(node)
    if problem is not None:
        return Refused(409, problem)
    seq = await _write(publisher, reads, NodeRemoved(node=node, reason=reason), principal)
    return seq if isinstance(seq, Refused) else NodeRemovedAnswer(node=node, seq=seq)


async def _known_node(reads: Reads, node: str, principal: Principal) -> NodeStanding | Refused:
    await reads.catch_up(principal.name)
    row = await reads.cluster.standing(node)
    if row is None or row.removed:
        return not_found(f"node {node}")
    return row


async def _node_after_write(reads: Reads, node: str, principal: Principal) -> Node:
    await reads.catch_up(principal.name)
    found = await reads.cluster.node(node)
    assert found is not None
    return found


@router.get("/v1/queue", response_model=Queue, tags=["queue"])
async def queue(reads: ReadsDep, principal: PrincipalDep, limit: int = 1000) -> Queue:
    """Pending jobs in queue order with each priority factor (like Slurm's sprio)."""
    await reads.catch_up(principal.name)
    return reads.cluster.queue(limit)


@router.get("/v1/audit", response_model=AuditView, tags=["audit"])
async def last_audit(reads: ReadsDep, principal: PrincipalDep) -> AuditView:
    """The latest `gpuloom audit` written to the log: decisions verified, mismatches."""
    await reads.catch_up(principal.name)
    return reads.cluster.audit()


@router.get("/v1/schemas/events", tags=["schemas"])
async def event_schemas() -> dict[str, Any]:
    """JSON Schema of every event type in the log, for outside subscribers."""
    return json_schemas()


@public.get("/healthz", response_model=Health, tags=["health"])
async def healthz(event_log: EventLogDep, reads: ReadsDep) -> Health:
    nats_ok = event_log.connected
    seq = reads.progress.written_seq()
    return Health(status="ok" if nats_ok else "degraded", nats=nats_ok, projection_seq=seq)

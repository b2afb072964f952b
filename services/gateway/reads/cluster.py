"""Reads of the cluster: the node rows (`GET /v1/nodes`, what an operator's write to a
node checks), the queue in order with each job's factors (`GET /v1/queue`), the latest
audit, and the fold's own rules on a pool change or a node's removal."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import select

from gpuloom.events import GpuPoolChanged
from gpuloom.queueing.order import pending_in_order, priority_weights, yields_to
from gpuloom.queueing.priority import FACTOR_SCALE
from gpuloom.state.dependencies import dependency_status
from gpuloom.state.rules.health import resume_problem
from gpuloom.state.rules.nodes import pool_change_problem, removal_problem
from gpuloom.store.models import NodeRow
from services.gateway.reads.source import Source
from services.gateway.schemas import AuditView, Node, NodeList, Queue, QueuedJob

#: The state of a removed node's last row (NodeRemoved): it is no longer listed.
REMOVED = "removed"


@dataclass(frozen=True, slots=True)
class NodeStanding:
    """A node's row as a write to it checks it: its state, its cordon, its GPUs."""

    state: str
    cordoned: str | None
    #: Each GPU as the row holds it (`index`, `pool`, ...).
    gpus: list[dict[str, Any]]

    @property
    def removed(self) -> bool:
        return self.state == REMOVED


class ClusterReads:
    __slots__ = ("_source",)

    def __init__(self, source: Source) -> None:
        self._source = source

    async def nodes(self) -> NodeList:
        """Every node not removed, by name."""
        async with self._source.session() as session:
            rows = await session.scalars(
                select(NodeRow).where(NodeRow.state != REMOVED).order_by(NodeRow.name)
            )
            return NodeList(nodes=[Node.model_validate(row, from_attributes=True) for row in rows])

    async def node(self, name: str) -> Node | None:
        """The node's row (a removed node's last one too), or None."""
        async with self._source.session() as session:
            row = await session.get(NodeRow, name)
            return Node.model_validate(row, from_attributes=True) if row is not None else None

    async def standing(self, name: str) -> NodeStanding | None:
        """What a write to the node checks of its row, or None (no row)."""
        async with self._source.session() as session:
            row = await session.get(NodeRow, name)
            return NodeStanding(row.state, row.cordoned, row.gpus) if row is not None else None

    def pool_change_problem(self, event: GpuPoolChanged) -> str | None:
        """Why the fold would void the pool change (work on the GPU), on the gateway's
        fold; None before it read the log."""
        state = self._source.folded()
        return pool_change_problem(state, event) if state is not None else None

    def resume_problem(self, node: str, index: int) -> str | None:
        """Why the fold would void resuming the GPU (it is in service), on the gateway's
        fold; None before it read the log."""
        state = self._source.folded()
        return resume_problem(state, node, index) if state is not None else None

    def removal_problem(self, node: str) -> str | None:
        """Why the node may not be removed now (it holds a job); None before the gateway
        read the log."""
        state = self._source.folded()
        return removal_problem(state, node) if state is not None else None

    def queue(self, limit: int) -> Queue:
        """Pending jobs in queue order with each priority factor (like Slurm's sprio)."""
        state = self._source.folded()
        if state is None:
            return Queue(weights={}, jobs=[])
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

    def audit(self) -> AuditView:
        """The latest `gpuloom audit` the fold holds, and how far the fold reaches."""
        state = self._source.folded()
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

"""One placement cycle: place pending jobs in queue order with one policy.

The cycle is a pure function of the folded state. Its decisions record the
sequence the state was folded to (`basis_seq`), their position in the cycle and
the policy (name, version, parameters), so that folding the log to `basis_seq`
and running the cycle again reproduces them exactly: that is what
`gpuloom audit` checks. The seed of seeded policies is `basis_seq` and the
typical workload of fragmentation-aware ones is derived from the jobs in the
state, so nothing outside the log enters a decision.
"""

from __future__ import annotations

from gpuloom.decide import Decision
from gpuloom.decide.queueing import gpu_demand, queue_order, quota_tracker
from gpuloom.events import JobPlaced, JobSpec, PolicyRef, ReplicaAssignment, SliceRef
from gpuloom.placement.engine import Context, NodeIndex, Policy, place
from gpuloom.placement.fragmentation import Shape, Workload
from gpuloom.placement.resources import GpuView, NodeView, Placement, Request
from gpuloom.state import ClusterState

#: How many of the latest submitted jobs make the typical workload.
WORKLOAD_WINDOW = 1000


def node_views(
    state: ClusterState, *, idle: bool = False, include_lost: bool = False
) -> list[NodeView]:
    """Ready nodes with what is free on them, ranked by name (the tie-break).

    `idle` shows every node as if nothing ran on it and `include_lost` adds lost
    nodes (they may come back): what admission asks about, "could this ever run".
    """
    views = []
    for rank, name in enumerate(sorted(state.nodes)):
        node = state.nodes[name]
        if node.phase != "ready" and not include_lost:
            continue
        gpus = [
            GpuView(
                gpu.index,
                gpu.uuid,
                gpu.model,
                "vgpu" if gpu.pool == "vgpu" else "physical",
                gpu.memory_mib,
                1000 if idle else 1000 - gpu.milli_used,
                gpu.memory_mib if idle else gpu.memory_mib - gpu.memory_used,
            )
            for _, gpu in sorted(node.gpus.items())
        ]
        spec = node.spec
        cpu_used, memory_used = (0, 0) if idle else (node.cpu_used, node.memory_used)
        views.append(
            NodeView(
                name=name,
                rank=rank,
                gpus=gpus,
                cpu_free_milli=spec.cpu_milli - cpu_used if spec.cpu_milli else None,
                memory_free_mib=spec.memory_mib - memory_used if spec.memory_mib else None,
                labels=dict(spec.labels),
                lends_remote_vgpu=spec.lends_remote_vgpu,
            )
        )
    return views


def request_of(spec: JobSpec) -> Request:
    return Request(
        gpus=spec.gpus,
        gpu_milli=spec.share_milli,
        gpu_memory_mib=spec.gpu_memory_mib,
        cpu_milli=spec.cpu_milli,
        memory_mib=spec.memory_mib,
        models=tuple(sorted(spec.gpu_model)),
        pool=spec.pool,
        locality=spec.locality,
        node_selector=tuple(sorted(spec.node_selector.items())),
        replicas=spec.replicas,
    )


def typical_workload(state: ClusterState, window: int = WORKLOAD_WINDOW) -> Workload:
    """The shapes of the latest `window` submitted jobs (FGD's typical workload)."""
    latest = sorted(state.jobs.values(), key=lambda job: job.submit_seq)[-window:]
    return Workload.typical(Shape.of(request_of(job.spec)) for job in latest)


def context_for(state: ClusterState, policy: Policy, position: int) -> Context:
    workload = typical_workload(state) if policy.name in ("fgd", "loom") else None
    return Context(seed=state.seq, position=position, workload=workload)


def placed_event(job_id: str, attempt: int, placement: Placement) -> JobPlaced:
    """The JobPlaced of `placement` (basis, position and policy filled in by the caller)."""
    replicas = [
        ReplicaAssignment(
            host=replica.host,
            slices=[
                SliceRef(
                    node=s.node, index=s.index, uuid=s.uuid, milli=s.milli, memory_mib=s.memory_mib
                )
                for s in replica.slices
            ],
            cpu_milli=replica.cpu_milli,
            memory_mib=replica.memory_mib,
        )
        for replica in placement.replicas
    ]
    first = placement.replicas[0]
    local = [s for s in first.slices if s.node == first.host]
    return JobPlaced(
        job_id=job_id,
        attempt=attempt,
        node=first.host,
        gpu_indexes=[s.index for s in local],
        gpu_uuids=[s.uuid for s in local],
        replicas=replicas,
        basis_seq=0,
        cycle_position=0,
        policy=PolicyRef(name="", version=0),
    )


def placement_cycle(state: ClusterState, policy: Policy, limit: int = 10_000) -> list[Decision]:
    """Place as many queued jobs as fit, in queue order; a job that does not fit is skipped."""
    views = node_views(state)
    if not views:
        return []
    index = NodeIndex(views)
    ref = PolicyRef(name=policy.name, version=policy.version, params=dict(policy.params))
    context = context_for(state, policy, 0)
    decisions: list[Decision] = []
    quotas = quota_tracker(state)
    for job in queue_order(state):
        if len(decisions) >= limit:
            break
        demand = gpu_demand(job)
        if quotas.why_not(job.spec.account, demand) is not None:
            continue  # held: QuotaExceeded (see `gpuloom explain`)
        position = len(decisions)
        decision_context = Context(context.seed, position, context.workload)
        placement = place(request_of(job.spec), index, policy, decision_context)
        if placement is None:
            continue
        quotas.take(job.spec.account, demand)
        event = placed_event(job.job_id, job.attempt + 1, placement).model_copy(
            update={"basis_seq": state.seq, "cycle_position": position, "policy": ref}
        )
        decisions.append(
            Decision(event, f"{job.job_id}:placed:{event.attempt}:{state.seq}", job.last_event_id)
        )
    return decisions

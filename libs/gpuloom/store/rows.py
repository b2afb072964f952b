"""Rows of the gateway's projections, computed from the folded state (pure)."""

from __future__ import annotations

from typing import Any

from gpuloom.state import ClusterState, JobState, NodeState
from gpuloom.state.dependencies import dependency_status
from gpuloom.state.model import GpuFault


def job_row(job: JobState, state: ClusterState | None = None) -> dict[str, Any]:
    """The row of `job`; with `state`, a job waiting on dependencies says so in `reason`."""
    spec = job.spec
    reason = job.reason
    if state is not None and spec.depends_on and job.phase in ("submitted", "admitted", "queued"):
        status, why = dependency_status(state, job.spec.depends_on)
        if status == "waiting":
            reason = why
    return {
        "id": job.job_id,
        "name": spec.name,
        "user": spec.user,
        "account": spec.account,
        "state": job.phase,
        "reason": reason,
        "node": job.node,
        "gpus": list(job.gpu_indexes),
        "gpus_requested": spec.gpus,
        "gpu_model": list(spec.gpu_model),
        "priority": job.priority,
        "command": list(spec.command),
        "time_limit_s": spec.time_limit_s,
        "attempt": job.attempt,
        "requeues": job.requeues,
        "cancel_requested": job.cancel_requested,
        "exit_code": job.exit_code,
        "idempotency_key": job.idempotency_key,
        "submit_seq": job.submit_seq,
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
        "last_seq": job.last_seq,
        "request": {
            "gpu_milli": spec.gpu_milli,
            "gpu_memory_mib": spec.gpu_memory_mib,
            "cpu_milli": spec.cpu_milli,
            "memory_mib": spec.memory_mib,
            "pool": spec.pool,
            "locality": spec.locality,
            "node_selector": dict(sorted(spec.node_selector.items())),
            "replicas": spec.replicas,
            "min_replicas": spec.min_replicas,
            "image": spec.image,
            "topology": spec.topology.model_dump() if spec.topology is not None else None,
            "reservation": spec.reservation,
        },
        "placement": [replica_view(job, number) for number in range(len(job.replicas))],
    }


def replica_view(job: JobState, number: int) -> dict[str, Any]:
    """Replica `number` of the job's current (or last) attempt: its host and slices, and
    where it stands: `placed`, `running`, or how it ended (with its exit code and why)."""
    view: dict[str, Any] = job.replicas[number].model_dump(mode="json")
    view["replica"] = number
    if number in job.finished_replicas:
        outcome, exit_code, reason = job.finished_replicas[number]
        left = number in job.left  # an elastic gang shrank: it left, the gang runs on
        view.update(state="left" if left else outcome, exit_code=exit_code, reason=reason)
    elif number in job.leaving:
        view["state"] = "leaving"
    else:
        view["state"] = "running" if number in job.started_replicas else "placed"
    return view


def _fault(fault: GpuFault | None) -> dict[str, str] | None:
    """A GPU out of service, as the row keeps it (None: in service)."""
    if fault is None:
        return None
    return {"check": fault.check, "evidence": fault.evidence, "at": fault.at.isoformat()}


def node_row(node: NodeState, state: ClusterState) -> dict[str, Any]:
    return {
        "name": node.name,
        "state": node.phase,
        "simulated": node.spec.simulated,
        "labels": dict(sorted(node.spec.labels.items())),
        "topology": [place.model_dump() for place in node.spec.topology],
        "cpu_milli": node.spec.cpu_milli,
        "memory_mib": node.spec.memory_mib,
        "gpus": [
            {
                "index": gpu.index,
                "uuid": gpu.uuid,
                "model": gpu.model,
                "memory_mib": gpu.memory_mib,
                "pool": gpu.pool,
                "allocated": not gpu.idle,
                "job_id": gpu.job_id,
                "milli_allocated": gpu.milli_used,
                "memory_allocated_mib": gpu.memory_used,
                "holders": [
                    {"job_id": job_id, "milli": milli, "memory_mib": memory}
                    for job_id, (milli, memory) in sorted(gpu.holders.items())
                ],
                "unhealthy": _fault(node.unhealthy.get(gpu.index)),
            }
            for _, gpu in sorted(node.gpus.items())
        ],
        "last_seq": state.seq,
        "lends_remote_vgpu": node.spec.lends_remote_vgpu,
        "isolation": node.spec.isolation,
        "runtimes": list(node.spec.runtimes),
        "cordoned": (node.cordon_reason or "cordoned") if node.cordoned else None,
    }

"""The cluster's gauges for `GET /metrics`, computed at scrape time from the state the
gateway has folded (`services.gateway.metrics` serves them)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import get_args

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.state import ClusterState
from gpuloom.state.model import JobPhase
from services.gateway.reads.source import Source

#: The window of `gpuloom_placements_last_minute`.
RECENT = timedelta(seconds=60)


class GaugeReads:
    __slots__ = ("_source",)

    def __init__(self, source: Source) -> None:
        self._source = source

    def cluster(self, clock: Callable[[], datetime]) -> list[Metric]:
        """`cluster_metrics` of the gateway's fold at `clock()`; none before it read the log."""
        state = self._source.folded()
        return cluster_metrics(state, clock()) if state is not None else []


def cluster_metrics(state: ClusterState, now: datetime) -> list[Metric]:
    """The cluster's gauges in `state`; `now` bounds the last minute of placements.

    Capacity and allocation count the GPUs of nodes that are not lost (cordoned ones
    included), by pool and model: a GPU is allocated when anything holds it, and its
    milli-GPU allocated are what its holders hold (1000 for a whole GPU)."""
    jobs = GaugeMetricFamily("gpuloom_jobs", "Jobs by state", labels=["state"])
    by_phase: Counter[str] = Counter(job.phase for job in state.jobs.values())
    by_phase.update(state.forgotten_by_phase)  # ended jobs the state no longer holds
    for phase in get_args(JobPhase):
        jobs.add_metric([phase], by_phase[phase])
    queue = GaugeMetricFamily(
        "gpuloom_queue_length", "Jobs queued, waiting for placement", value=len(state.queued)
    )

    nodes = GaugeMetricFamily("gpuloom_nodes", "Nodes by state", labels=["state"])
    node_states = Counter(
        "lost" if n.phase == "lost" else "cordoned" if n.cordoned else "ready"
        for n in state.nodes.values()
    )
    for node_state in ("ready", "cordoned", "lost"):
        nodes.add_metric([node_state], node_states[node_state])

    pools = ["pool", "model"]
    gpus = GaugeMetricFamily("gpuloom_gpus", "GPUs of nodes not lost", labels=pools)
    gpus_held = GaugeMetricFamily(
        "gpuloom_gpus_allocated", "GPUs something holds (whole or a slice)", labels=pools
    )
    milli = GaugeMetricFamily(
        "gpuloom_gpu_milli", "Milli-GPU of nodes not lost (1000 per GPU)", labels=pools
    )
    milli_held = GaugeMetricFamily(
        "gpuloom_gpu_milli_allocated", "Milli-GPU held by jobs", labels=pools
    )
    partly = GaugeMetricFamily(
        "gpuloom_gpus_partly_allocated",
        "GPUs that slices hold only in part (fragmentation: room no whole-GPU job can use)",
        labels=pools,
    )
    unhealthy = GaugeMetricFamily(
        "gpuloom_gpus_unhealthy",
        "GPUs out of service since a health check failed (GpuUnhealthy), until resumed",
        labels=pools,
    )
    by_account = GaugeMetricFamily(
        "gpuloom_account_gpu_milli_allocated",
        "Milli-GPU held by each account's placed and running jobs",
        labels=["account"],
    )
    count: Counter[tuple[str, str]] = Counter()
    held: Counter[tuple[str, str]] = Counter()
    milli_used: Counter[tuple[str, str]] = Counter()
    part: Counter[tuple[str, str]] = Counter()
    failed: Counter[tuple[str, str]] = Counter()
    accounts: Counter[str] = Counter()
    for node in state.nodes.values():
        if node.phase == "lost":
            continue
        for gpu in node.gpus.values():
            key = (gpu.pool, gpu.model)
            used = gpu.milli_used
            count[key] += 1
            held[key] += not gpu.idle
            milli_used[key] += used
            part[key] += 0 < used < MILLI_PER_GPU
            failed[key] += gpu.index in node.unhealthy
            for job_id, (share, _) in gpu.holders.items():
                job = state.jobs.get(job_id)
                accounts[job.spec.account if job is not None else ""] += share
    for key in sorted(count):
        gpus.add_metric(list(key), count[key])
        gpus_held.add_metric(list(key), held[key])
        milli.add_metric(list(key), MILLI_PER_GPU * count[key])
        milli_held.add_metric(list(key), milli_used[key])
        partly.add_metric(list(key), part[key])
        unhealthy.add_metric(list(key), failed[key])
    for account in sorted(accounts):
        by_account.add_metric([account], accounts[account])

    placements = CounterMetricFamily(
        "gpuloom_placements",
        "Placement decisions folded (JobPlaced): rate() is decisions per second",
        value=state.forgotten_attempts + sum(job.attempt for job in state.jobs.values()),
    )
    recent = GaugeMetricFamily(
        "gpuloom_placements_last_minute",
        "Jobs whose last placement was made in the last 60 s, ended ones included",
        value=placed_since(state, now - RECENT),
    )
    head_wait = GaugeMetricFamily(
        "gpuloom_queue_head_wait_seconds",
        "How long the job that has waited longest in the queue has waited (log time)",
        value=queue_head_wait(state),
    )
    audit = GaugeMetricFamily(
        "gpuloom_audit_mismatches",
        "Decisions the last `gpuloom audit` could not re-make (0 before any audit)",
        value=state.last_audit.mismatch_count if state.last_audit is not None else 0,
    )
    return [
        jobs, queue, nodes, gpus, gpus_held, milli, milli_held, partly, unhealthy, by_account,
        placements, recent, head_wait, audit, *reservation_metrics(state),
    ]  # fmt: skip


def queue_head_wait(state: ClusterState) -> float:
    """Seconds, on the log's clock, since the earliest-submitted queued job was submitted
    (0 when nothing is queued): a queue whose head stops moving shows as this growing."""
    if not state.queued or state.clock is None:
        return 0.0
    oldest = min(state.jobs[job_id].submitted_at for job_id in state.queued)
    return max(0.0, (state.clock - oldest).total_seconds())


def reservation_metrics(state: ClusterState) -> list[Metric]:
    """GPUs advance reservations hold, by reservation and whether it started, and of
    those that started, the GPUs nothing runs on (reserved and idle: what a reservation
    costs the cluster while its users do not use it)."""
    reserved = GaugeMetricFamily(
        "gpuloom_gpus_reserved",
        "GPUs held by advance reservations (state: pending before the start, active after)",
        labels=["reservation", "state", "maint"],
    )
    idle = GaugeMetricFamily(
        "gpuloom_gpus_reserved_idle",
        "GPUs of active advance reservations that nothing holds",
        labels=["reservation"],
    )
    for name, booked in sorted(state.reservations.items()):
        phase = "active" if booked.started else "pending"
        reserved.add_metric([name, phase, str(booked.maint).lower()], len(booked.gpus))
        if booked.started:
            unused = 0
            for node_name, index in booked.gpus:
                node = state.nodes.get(node_name)
                gpu = node.gpus.get(index) if node is not None else None
                unused += gpu is not None and gpu.idle
            idle.add_metric([name], unused)
    return [reserved, idle]


def placed_since(state: ClusterState, since: datetime) -> int:
    """Jobs whose last placement was made at `since` or later: the live ones, and those
    that ended and left the state since then (the newest end of `retired`: a job ends
    after it is placed, so no older entry can have been placed since)."""
    live = sum(1 for job in state.jobs.values() if job.placed_at and job.placed_at >= since)
    gone: set[str] = set()
    for left, job_id in reversed(state.retired):
        if left < since:
            break
        tombstone = state.tombstones.get(job_id)
        if tombstone is not None and tombstone.placed_at and tombstone.placed_at >= since:
            gone.add(job_id)
    return live + len(gone)

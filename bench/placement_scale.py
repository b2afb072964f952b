"""Placement at scale: the live placement path on 5,000 nodes x 8 GPUs, 50,000 pending jobs.

The cluster and the jobs are folded from events, as the placement service folds
them; the jobs are drawn (seeded) from the Alibaba openb pod list, so the mix of
whole GPUs, fractions, CPU-only tasks, CPU/memory requests and GPU-model
constraints is the real one. Nodes take their CPU, memory and GPU model from the
openb node list (8 GPUs each, in the vGPU pool, so fractions can land anywhere).

Printed, per policy: the first placement cycle (the service places up to
10,000 jobs per cycle), then cycles as the service runs them (each folded into
the state before the next) until nothing more fits, with decisions (placements)
per second; then how fast `gpuloom audit` re-makes every decision, fold included, in
one process and in several (`--audit-workers 1,2`: the processes it shares the work
among, one timing each).

Then the steady state a busy cluster lives in: the cluster is full and a backlog
waits. Every placed job starts; before each of `--steady` cycles, `--churn` running
jobs (drawn, seeded) end and as many new jobs are submitted, and one cycle runs.
Printed: the cycle's time (p50, p90) and decisions per second. Every cycle there
has a blocked job, so it pays what a blocked job costs (the reservation search,
the preemption check) on top of placing the few jobs that fit.

  python bench/placement_scale.py [--nodes 5000] [--jobs 50000] [--policies bestfit,fgd]
                                  [--steady 30] [--churn 20] [--backfill-depth 500]

`--reservations N` makes N advance reservations of 64 GPUs (8 nodes each) starting an
hour after the jobs arrive (docs/reservations.md): every pass fences their GPUs.
`--topology F` puts the nodes in racks of 32 (and each in its own NVLink domain) and
turns a share F of the jobs of 2 or more whole GPUs into gangs of one-GPU replicas that
ask `"topology": {"level": "rack", "mode": "required"}`: the pass tries the racks for
each of them, tightest first (docs/topology.md). Compare a run
with them against one without, in the same hour.

`--backfill-depth N` records `QueuePolicySet(backfill_depth=N)` in the log, as the
queue service does with GPULOOM_BACKFILL_DEPTH: each pass then tries at most N jobs
behind the first that cannot start. Without it (0) every job is tried.
"""

from __future__ import annotations

import argparse
import random
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from gpuloom.audit import audit
from gpuloom.events import (
    GpuSpec,
    JobAdmitted,
    JobFinished,
    JobPlaced,
    JobQueued,
    JobStarted,
    JobSubmitted,
    NodeRegistered,
    NodeSpec,
    QueuePolicySet,
    Recorded,
    ReservationCreated,
    ReservationSpec,
    ReservedGpu,
    TopologyPlace,
    make_envelope,
)
from gpuloom.events.jobs import TopologyRequest
from gpuloom.placement import IndexCache, default_registry, placement_cycle
from gpuloom.placement.engine import Policy
from gpuloom.runtime.collector import tune_collector
from gpuloom.sim.trace import TraceTask, load_nodes, load_tasks
from gpuloom.state import ClusterState, apply
from gpuloom.state.changes import ChangeFeed
from gpuloom.testing.builders import make_job_spec

TRACE = Path(__file__).resolve().parents[2] / "shared/traces/alibaba-gpu-v2023"
AT = datetime(2026, 1, 1, tzinfo=UTC)


class Log:
    def __init__(self) -> None:
        self.records: list[Recorded] = []

    def append(self, event: object) -> Recorded:
        seq = len(self.records) + 1
        envelope = make_envelope(event, at=AT, by="bench", event_id=f"e{seq}")  # type: ignore[arg-type]
        record = Recorded(seq, envelope, event)  # type: ignore[arg-type]
        self.records.append(record)
        return record


def build(
    nodes: int,
    jobs: int,
    seed: int,
    backfill_depth: int = 0,
    reservations: int = 0,
    topology: float = 0.0,
) -> Log:
    rng = random.Random(seed)
    trace_nodes = load_nodes(TRACE / "openb_node_list_gpu_node.csv")
    tasks = load_tasks(TRACE / "openb_pod_list_default.csv")
    log = Log()
    if backfill_depth:  # as the queue service records GPULOOM_BACKFILL_DEPTH
        log.append(QueuePolicySet(backfill_depth=backfill_depth))
    for n in range(nodes):
        like = trace_nodes[rng.randrange(len(trace_nodes))]
        name = f"node-{n:05d}"
        gpus = [
            GpuSpec(index=i, uuid=f"{name}-{i}", model=like.model, memory_mib=32_768, pool="vgpu")
            for i in range(8)
        ]
        places = (
            [TopologyPlace(level="nvlink", domain=name), TopologyPlace(level="rack", domain=f"r{n // 32:03d}")]
            if topology
            else []
        )  # fmt: skip
        spec = NodeSpec(
            gpus=gpus,
            cpu_milli=max(like.cpu_milli, 96_000),
            memory_mib=like.memory_mib,
            topology=places,
        )
        log.append(NodeRegistered(node=name, spec=spec))
    for r in range(min(reservations, nodes // 8)):
        held = [
            ReservedGpu(node=f"node-{n:05d}", index=i)
            for n in range(8 * r, 8 * r + 8)
            for i in range(8)
        ]
        window = ReservationSpec(
            start=AT + timedelta(hours=1), end=AT + timedelta(hours=3), gpus=held, users=["alice"]
        )
        log.append(ReservationCreated(name=f"res-{r:03d}", spec=window))
    for j in range(jobs):
        task = tasks[rng.randrange(len(tasks))]
        for event in submission(
            j, task, rack=bool(topology) and task.gpus > 0 and rng.random() < topology
        ):
            log.append(event)
    return log


def submission(number: int, task: TraceTask, *, rack: bool = False) -> list[object]:
    """The events of submitting job `number` with `task`'s shape, admitted and queued
    (`rack`: asking to be inside one rack)."""
    extra: dict[str, Any] = {"cpu_milli": task.cpu_milli, "memory_mib": task.memory_mib}
    gpus = task.gpus
    if rack:  # a gang of one-GPU replicas, all inside one rack
        extra["topology"] = TopologyRequest(level="rack", mode="required")
        extra["replicas"], gpus = task.gpus, 1
        extra["cpu_milli"] = -(-task.cpu_milli // task.gpus)
        extra["memory_mib"] = -(-task.memory_mib // task.gpus)
    if task.gpus and task.gpu_milli < 1000:
        extra["gpu_milli"] = task.gpu_milli
    spec = make_job_spec(gpus, gpu_model=list(task.models), priority=number % 5, **extra)
    job_id = f"job-{number:06d}"
    return [
        JobSubmitted(job_id=job_id, spec=spec),
        JobAdmitted(job_id=job_id),
        JobQueued(job_id=job_id, priority=number % 5),
    ]


def steady(
    state: ClusterState, log: Log, policy: Policy, kept: IndexCache, cycles: int, churn: int
) -> str:
    """Cycles on the full cluster, `churn` jobs ending and as many arriving before each."""
    rng = random.Random(7)
    tasks = load_tasks(TRACE / "openb_pod_list_default.csv")

    def fold(event: object) -> None:
        kept.changes.apply(state, log.append(event))

    running: list[tuple[str, int, str]] = []
    for job_id in sorted(j for jobs in state.on_node.values() for j in jobs):
        job = state.jobs[job_id]
        running.append((job_id, job.attempt, job.replicas[0].host))
        fold(JobStarted(job_id=job_id, attempt=job.attempt, node=job.replicas[0].host))
    number = len(state.jobs)
    seconds: list[float] = []
    placed = 0
    for _ in range(cycles):
        for _ in range(churn):
            job_id, attempt, node = running.pop(rng.randrange(len(running)))
            fold(JobFinished(job_id=job_id, attempt=attempt, node=node, outcome="succeeded"))
            for event in submission(number, tasks[rng.randrange(len(tasks))]):
                fold(event)
            number += 1
        started = time.perf_counter()
        decisions = placement_cycle(state, policy, kept=kept)
        seconds.append(time.perf_counter() - started)
        for decision in decisions:
            fold(decision.event)
            if isinstance(decision.event, JobPlaced):
                placed += 1
                event = decision.event
                host = event.replicas[0].host
                running.append((event.job_id, event.attempt, host))
                fold(JobStarted(job_id=event.job_id, attempt=event.attempt, node=host))
    seconds.sort()
    return (
        f"{policy.name:8s} steady, {cycles} cycles on the full cluster ({churn} jobs end and "
        f"{churn} arrive before each; {len(running)} running, {len(state.queued)} queued): "
        f"cycle p50 {1000 * seconds[len(seconds) // 2]:.0f} ms, p90 "
        f"{1000 * seconds[int(0.9 * len(seconds))]:.0f} ms; {placed} placed "
        f"({placed / sum(seconds):,.0f} decisions/s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=5000)
    parser.add_argument("--jobs", type=int, default=50_000)
    parser.add_argument("--policies", default="bestfit,fgd")
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--steady", type=int, default=30, help="cycles on the full cluster")
    parser.add_argument("--churn", type=int, default=20, help="jobs ending and arriving per cycle")
    parser.add_argument(
        "--backfill-depth",
        type=int,
        default=0,
        help="QueuePolicySet.backfill_depth in the log (0: none, every job tried)",
    )
    parser.add_argument(
        "--reservations", type=int, default=0, help="advance reservations of 64 GPUs"
    )
    parser.add_argument(
        "--topology",
        type=float,
        default=0.0,
        help="share of multi-GPU jobs made gangs that must be inside one rack",
    )
    parser.add_argument(
        "--audit-workers",
        default="1,2",
        help="the audit's processes, one timing per count (gpuloom audit --workers)",
    )
    args = parser.parse_args()
    tune_collector()  # as the placement service and `gpuloom audit` do
    started = time.perf_counter()
    log = build(
        args.nodes, args.jobs, args.seed, args.backfill_depth, args.reservations, args.topology
    )
    state = ClusterState()
    for record in log.records:
        apply(state, record)
    print(
        f"{args.nodes} nodes x 8 GPUs, {args.jobs} pending jobs from the openb mix"
        f" ({args.reservations} reservations, {args.topology:.0%} of multi-GPU jobs rack gangs): "
        f"log of {len(log.records)} events built and folded in {time.perf_counter() - started:.1f} s"
    )
    registry = default_registry()
    for name in args.policies.split(","):
        policy = registry.get(name)
        audited = Log()
        audited.records = list(log.records)
        changes = ChangeFeed()  # what the placement service's follower feeds its cache
        cycle_state = changes.fold(ClusterState(), log.records)
        kept = IndexCache(changes)
        placed = cycles = 0
        cycle_seconds = 0.0
        first: tuple[float, int] | None = None
        while True:
            started = time.perf_counter()
            decisions = placement_cycle(cycle_state, policy, kept=kept)
            spent = time.perf_counter() - started
            cycle_seconds += spent
            if first is None:
                first = (spent, sum(1 for d in decisions if isinstance(d.event, JobPlaced)))
            if not decisions:
                break
            cycles += 1
            placed += sum(1 for d in decisions if isinstance(d.event, JobPlaced))
            for decision in decisions:
                changes.apply(cycle_state, audited.append(decision.event))
        assert first is not None
        print(
            f"{name:8s} first cycle: {first[1]} placed in {first[0]:.2f} s "
            f"({first[1] / first[0]:,.0f} decisions/s); until the cluster is full: {placed} "
            f"placed in {cycles} cycles, {cycle_seconds:.2f} s ({placed / cycle_seconds:,.0f} "
            f"decisions/s, {len(cycle_state.queued)} jobs left queued)"
        )
        for workers in (int(n) for n in args.audit_workers.split(",")):
            report = audit(audited.records, workers=workers)
            assert report.ok, report.mismatches[:3]
            label = "audit" if report.workers == 1 else f"audit in {report.workers} processes"
            print(
                f"{name:8s} {label}: {report.verified} decisions verified in "
                f"{report.seconds:.2f} s ({report.verified / report.seconds:,.0f} decisions/s, "
                f"fold of {len(audited.records)} events included)",
                flush=True,
            )
        if args.steady:
            print(steady(cycle_state, audited, policy, kept, args.steady, args.churn), flush=True)


if __name__ == "__main__":
    main()

"""What a maintenance window costs: GPU-hours left idle before it, with and without backfill.

An operator announces maintenance of some nodes `--notice` hours ahead. Three ways to
keep the window clear, replayed on the same seeded stream of jobs through gpuloom's own
fold and decisions (admission, queue, `placement_cycle` with best fit), in simulated time:

- `reservation`: a `maint` advance reservation of the nodes' GPUs from the window's
  start (gpuloom, docs/reservations.md): until then, jobs whose time limit ends before
  the start still run there (backfill); jobs without a limit, or a longer one, do not;
- `cordon`: the nodes are cordoned when the window is announced (what an operator does
  without reservations): nothing new lands on them from then on;
- `nothing`: no action, to show what the window would otherwise meet.

Jobs: 1 to 4 GPUs, a time limit of 10 minutes to 8 hours (a tenth have none), running
30 to 100% of it; arrivals offer 1.3 times what the cluster can run, so it stays busy
and a queue builds. The reservation is made with `ignore_jobs`: jobs already running
when the window is announced may cross into it in every way alike. Prints, per way: the GPU-hours the
maintenance nodes stood idle between the announcement and the window, the GPU-hours of
jobs still running on them inside the window (what the maintenance would have to kill),
the jobs finished cluster-wide by the window's start, and the mean wait.

  python bench/maintenance_window.py [--nodes 8] [--maint-nodes 2] [--notice 6] [--seed 3]
"""

from __future__ import annotations

import argparse
import heapq
import random
import statistics
from dataclasses import dataclass, field
from datetime import timedelta

from gpuloom.decide.admission import decide_admission
from gpuloom.decide.queueing import decide_queue
from gpuloom.events import (
    Decision,
    JobPlaced,
    NodeCordoned,
    Recorded,
    ReservationCreated,
    ReservationSpec,
    ReservedGpu,
)
from gpuloom.placement import BestFit, placement_cycle
from gpuloom.state import ClusterState, apply
from gpuloom.testing.builders import T0, LogBuilder

GPUS = 8
MINUTE = 60
#: Offered load: GPU-seconds asked per GPU-second the cluster has.
LOAD = 1.3
#: The mean job: 2 GPUs (1, 1, 2, 2 or 4) for 0.65 of a mean limit of 156.7 minutes.
GPU_SECONDS_PER_JOB = 2 * 0.65 * 156.7 * MINUTE


@dataclass(order=True)
class Job:
    arrives: int
    job_id: str = field(compare=False)
    gpus: int = field(compare=False)
    limit_s: int | None = field(compare=False)
    runs_s: int = field(compare=False)


def workload(seed: int, hours: float, nodes: int) -> list[Job]:
    """Arrivals that keep `nodes` x 8 GPUs about full: one job every few minutes."""
    rng = random.Random(seed)
    jobs, at, k = [], 0, 0
    while at < hours * 3600:
        gpus = rng.choice([1, 1, 2, 2, 4])
        limit = rng.choice([10, 30, 60, 120, 240, 480]) * MINUTE
        runs = int(limit * rng.uniform(0.3, 1.0))
        jobs.append(Job(at, f"j{k:05d}", gpus, None if rng.random() < 0.1 else limit, runs))
        at += int(rng.expovariate(LOAD * nodes * GPUS / GPU_SECONDS_PER_JOB)) + 1
        k += 1
    return jobs


@dataclass
class Outcome:
    idle_gpu_h: float
    inside_gpu_h: float
    finished_by_window: int
    mean_wait_min: float


def replay(way: str, jobs: list[Job], nodes: int, maint: int, notice_h: float,
           window_h: float, warmup_h: float) -> Outcome:  # fmt: skip
    """Replay `jobs` with the window announced after `warmup_h` hours, `notice_h` ahead."""
    log = LogBuilder(step=timedelta(milliseconds=1))
    state = ClusterState()  # folded as the log grows (LogBuilder.state() folds it all)

    def fold_in(*records: Recorded) -> None:
        for record in records:
            apply(state, record)

    def decided(decisions: list[Decision], t: int) -> None:
        for d in decisions:
            fold_in(log.append(d.event, at=at(t), causation_id=d.causation_id))

    names = [f"n{i:02d}" for i in range(nodes)]
    for name in names:
        fold_in(log.register(name, GPUS, at=T0))
    maint_nodes = names[:maint]
    announce = int(warmup_h * 3600)
    start = announce + int(notice_h * 3600)
    end = start + int(window_h * 3600)
    pending = sorted(jobs)
    by_id = {job.job_id: job for job in jobs}
    ends: list[tuple[int, str, str]] = []  # (time, job, node)
    placed_at: dict[str, int] = {}
    on_node: dict[str, tuple[str, int, int]] = {}  # job -> (node, gpus, placed at)
    idle = inside = 0.0
    finished_by_window = 0
    clock = 0
    announced = False
    index = 0

    def at(t: int):  # type: ignore[no-untyped-def]
        return T0 + timedelta(seconds=t)

    def maint_busy() -> int:
        return sum(g for node, g, _ in on_node.values() if node in maint_nodes)

    while index < len(pending) or ends:
        t_next = min(
            pending[index].arrives if index < len(pending) else 1 << 40,
            ends[0][0] if ends else 1 << 40,
            announce if not announced else 1 << 40,
        )
        if t_next >= end:
            break
        # the idle GPU-seconds of the maintenance nodes between announcement and window
        lo, hi = max(clock, announce), min(t_next, start)
        if hi > lo:
            idle += (maint * GPUS - maint_busy()) * (hi - lo)
        clock = t_next
        if not announced and clock >= announce:
            announced = True
            if way == "reservation":
                spec = ReservationSpec(
                    start=at(start), end=at(end), flags=["maint", "ignore_jobs"],
                    gpus=[ReservedGpu(node=n, index=i) for n in maint_nodes for i in range(GPUS)],
                )  # fmt: skip
                fold_in(log.append(ReservationCreated(name="maint", spec=spec), at=at(clock)))
                assert "maint" in state.reservations, state.recent_voided[-1:]
            elif way == "cordon":
                for name in maint_nodes:
                    fold_in(log.append(NodeCordoned(node=name, reason="maintenance"), at=at(clock)))
        while ends and ends[0][0] <= clock:
            t, job_id, node = heapq.heappop(ends)
            fold_in(log.finish(job_id, node, at=at(t)))
            held = on_node.pop(job_id, None)
            if held is not None and node in maint_nodes:
                inside += held[1] * max(0, min(t, end) - max(start, held[2]))
            finished_by_window += t <= start
        while index < len(pending) and pending[index].arrives <= clock:
            job = pending[index]
            index += 1
            fold_in(log.submit(job.job_id, gpus=job.gpus, time_limit_s=job.limit_s, at=at(clock)))
        decided(decide_admission(state), clock)
        decided(decide_queue(state), clock)
        for decision in placement_cycle(state, BestFit()):
            decided([decision], clock)
            event = decision.event
            if isinstance(event, JobPlaced) and state.jobs[event.job_id].phase == "placed":
                job = by_id[event.job_id]
                fold_in(log.start(event.job_id, event.node, at=at(clock)))
                placed_at[event.job_id] = clock - job.arrives
                on_node[event.job_id] = (event.node, job.gpus, clock)
                heapq.heappush(ends, (clock + job.runs_s, event.job_id, event.node))
    # what still runs on the maintenance nodes inside the window
    for t, job_id, node in ends:
        held = on_node.get(job_id)
        if held is not None and node in maint_nodes:
            inside += held[1] * max(0, min(t, end) - max(start, held[2]))
    waits = [w / 60 for w in placed_at.values()]
    return Outcome(idle / 3600, max(0.0, inside) / 3600, finished_by_window,
                   statistics.fmean(waits) if waits else 0.0)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=8)
    parser.add_argument("--maint-nodes", type=int, default=2)
    parser.add_argument(
        "--notice", type=float, default=6.0, help="hours between announcement and window"
    )
    parser.add_argument("--window", type=float, default=2.0, help="hours the window lasts")
    parser.add_argument(
        "--warmup", type=float, default=4.0, help="hours of load before the announcement"
    )
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    hours = args.warmup + args.notice + args.window
    jobs = workload(args.seed, hours, args.nodes)
    print(
        f"{args.nodes} nodes x {GPUS} GPUs, {args.maint_nodes} to maintain; {len(jobs)} jobs over "
        f"{hours:.0f} h; window announced at {args.warmup:.0f} h, {args.notice:.0f} h ahead, "
        f"lasting {args.window:.0f} h (seed {args.seed})"
    )
    print(
        f"{'way':12} {'idle GPU-h before':>18} {'GPU-h inside window':>20} {'finished by start':>18} {'mean wait min':>14}"
    )
    for way in ("reservation", "cordon", "nothing"):
        found = replay(
            way, jobs, args.nodes, args.maint_nodes, args.notice, args.window, args.warmup
        )
        print(f"{way:12} {found.idle_gpu_h:18.1f} {found.inside_gpu_h:20.1f} "
              f"{found.finished_by_window:18d} {found.mean_wait_min:14.1f}")  # fmt: skip
    possible = args.maint_nodes * GPUS * args.notice
    print(f"(the maintenance nodes had {possible:.0f} GPU-hours between announcement and window)")


if __name__ == "__main__":
    main()

"""Queueing what-if: a timed trace through the live scheduling pass, in simulated time.

Jobs arrive at their creation time, run for their recorded time (deletion minus
creation) and declare a time limit (that runtime rounded up to the minute), so
the scheduler knows only limits, as a real one would. Every time something
arrives or ends, one pass of `gpuloom.placement.scheduling.schedule` runs: the
same code as the live placement cycle, with the same engine and policy. The
queue order and the backfill mode are what the comparison varies:

* `fifo`: arrival order, strict (nothing passes the first job that cannot start);
* `priority`: priority class first, then arrival, strict;
* `priority+backfill`: the same order with EASY backfill.

and, as a control no queue policy of gpuloom offers, `greedy`: arrival order, every
job that fits starts, and no job holds a reservation (each job is a pass of its own,
so nothing keeps a later job off what a blocked one waits for).

Preemption is off: the comparison is about ordering and backfill. A node may have a
place in a topology (`places`: node name -> level -> domain) and a task may ask for
something other than its trace row's request (`TimedTask.asks`: a gang with a
topology request, `gpuloom.sim.domains`).
"""

from __future__ import annotations

import csv
import heapq
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.candidate import Candidate
from gpuloom.placement.engine import Context, NodeIndex, Policy, release
from gpuloom.placement.holdings import Holding
from gpuloom.placement.outcomes import Outcome, Placed
from gpuloom.placement.resources import NodeView, Placement, Request
from gpuloom.placement.scheduling import Backfill, PassInputs, Rules, schedule
from gpuloom.placement.topology import place
from gpuloom.sim.trace import TraceNode, TraceTask, load_tasks

#: Priority classes of the trace's QoS labels (Kubernetes' and Alibaba's names).
QOS_CLASS = {"Guaranteed": 2, "LS": 2, "Burstable": 1, "BE": 0}
MODES: dict[str, tuple[bool, Backfill]] = {
    "fifo": (False, "off"),
    "priority": (True, "off"),
    "priority+backfill": (True, "easy"),
}
#: The control: arrival order, every job that fits starts, no reservation (module doc).
GREEDY = "greedy"


@dataclass(frozen=True, slots=True)
class TimedTask:
    task: TraceTask
    arrival_s: int
    runtime_s: int
    priority_class: int
    #: What it asks placement for (None: its trace row's request, `TraceTask.request`).
    asks: Request | None = None

    def request(self) -> Request:
        return self.asks if self.asks is not None else self.task.request()

    @property
    def time_limit_s(self) -> int:
        """The runtime rounded up to the whole minute (at least one)."""
        return max(60, math.ceil(self.runtime_s / 60) * 60)


def load_timed_tasks(path: Path, compress: int = 1) -> list[TimedTask]:
    """The pod list with creation and deletion times and QoS (`EVALUATION.md` §1).

    `compress` divides the arrival times (not the runtimes): the trace's jobs fill
    well under 1% of even a third of its cluster, so time between arrivals is
    compressed to make a queue form at all.
    """
    tasks = {task.name: task for task in load_tasks(path)}
    timed = []
    with path.open(newline="") as handle:
        for row in csv.DictReader(handle):
            created, deleted = int(row["creation_time"]), int(row["deletion_time"])
            timed.append(
                TimedTask(
                    tasks[row["name"]],
                    created // compress,
                    max(1, deleted - created),
                    QOS_CLASS.get(row["qos"], 0),
                )
            )
    return timed


def third_of(nodes: Sequence[TraceNode]) -> list[TraceNode]:
    """Every third node in name order: a cluster a third the size, with the same mix."""
    return [
        node for number, node in enumerate(sorted(nodes, key=lambda n: n.name)) if number % 3 == 0
    ]


@dataclass
class QueueRun:
    mode: str
    jobs: int = 0
    #: Jobs that fit no node of the (idle) cluster at all, left out.
    never_fit: int = 0
    waits_s: list[int] = field(default_factory=list)
    waits_by_class: dict[int, list[int]] = field(default_factory=dict)
    backfilled: int = 0
    #: (time, allocated milli-GPU) after every pass: utilisation over time.
    allocated: list[tuple[int, int]] = field(default_factory=list)
    capacity_milli: int = 0
    makespan_s: int = 0
    passes: int = 0
    seconds: float = 0.0
    #: Task number -> the nodes it was placed on (hosts and lenders, sorted).
    nodes_of: dict[int, tuple[str, ...]] = field(default_factory=dict)
    #: Task number -> its wait, seconds.
    wait_of: dict[int, int] = field(default_factory=dict)

    def mean_wait(self, waits: Sequence[int] | None = None) -> float:
        waits = self.waits_s if waits is None else waits
        return sum(waits) / len(waits) if waits else 0.0

    def p95_wait(self, waits: Sequence[int] | None = None) -> float:
        waits = sorted(self.waits_s if waits is None else waits)
        return float(waits[min(len(waits) - 1, math.ceil(0.95 * len(waits)) - 1)]) if waits else 0.0

    def utilisation_series(self, start: int, end: int, points: int = 10) -> list[float]:
        """Mean utilisation over `points` equal slices of [start, end)."""
        step = max(1, (end - start) // points)
        return [self.utilisation(start + k * step, start + (k + 1) * step) for k in range(points)]

    def utilisation(self, start: int = 0, end: int | None = None) -> float:
        """Time-weighted mean of allocated / capacity over [start, end)."""
        end = self.makespan_s if end is None else end
        total = 0.0
        points = self.allocated
        for (when, value), (after, _) in zip(points, [*points[1:], (end, 0)], strict=True):
            lo, hi = max(when, start), min(after, end)
            if hi > lo:
                total += value * (hi - lo)
        return total / (self.capacity_milli * (end - start)) if end > start else 0.0


def _fits_idle(request: Request, idle: NodeIndex, policy: Policy) -> bool:
    placement = place(request, idle, policy, Context())
    if placement is None:
        return False
    for replica in placement.replicas:
        release(idle, replica)
    return True


def simulate(
    nodes: Sequence[TraceNode],
    tasks: Sequence[TimedTask],
    policy: Policy,
    mode: str,
    backfill_depth: int | None = 500,
    places: Mapping[str, Mapping[str, str]] | None = None,
    observe: Callable[[int, list[Outcome]], None] | None = None,
) -> QueueRun:
    """Run the trace through `schedule` in `mode` (see the module doc). `places`: each
    node's place in the topology, by name; `observe(now, outcomes)` sees every pass."""
    started = time.perf_counter()
    greedy = mode == GREEDY
    by_priority, backfill = MODES["fifo"] if greedy else MODES[mode]
    where = places or {}

    def view(node: TraceNode, rank: int) -> NodeView:
        return replace(node.view(rank), topology=dict(where.get(node.name, {})))

    views = [view(node, rank) for rank, node in enumerate(sorted(nodes, key=lambda n: n.name))]
    index = NodeIndex(views)
    run = QueueRun(mode, capacity_milli=sum(n.gpus for n in nodes) * MILLI_PER_GPU)
    idle = NodeIndex([view(node, rank) for rank, node in enumerate(nodes)])
    order = sorted(range(len(tasks)), key=lambda i: (tasks[i].arrival_s, tasks[i].task.name))
    feasible = [i for i in order if _fits_idle(tasks[i].request(), idle, policy)]
    run.never_fit = len(order) - len(feasible)
    run.jobs = len(feasible)
    arrivals = [(tasks[i].arrival_s, i) for i in feasible]
    ends: list[tuple[int, int]] = []  # (end time s, task number), a heap
    pending: list[int] = []
    running: dict[int, Holding] = {}
    allocated = 0
    next_arrival = 0
    now = 0
    while next_arrival < len(arrivals) or ends:
        now = min(
            arrivals[next_arrival][0] if next_arrival < len(arrivals) else math.inf,
            ends[0][0] if ends else math.inf,
        )  # type: ignore[assignment]
        while ends and ends[0][0] == now:
            _, number = heapq.heappop(ends)
            holding = running.pop(number)
            for replica in holding.replicas:
                release(index, replica)
            allocated -= holding.gpu_milli
        while next_arrival < len(arrivals) and arrivals[next_arrival][0] == now:
            pending.append(arrivals[next_arrival][1])
            next_arrival += 1
        if by_priority:
            pending.sort(
                key=lambda i: (-tasks[i].priority_class, tasks[i].arrival_s, tasks[i].task.name)
            )
        candidates = [
            Candidate(str(i), tasks[i].request(), tasks[i].time_limit_s, tasks[i].priority_class)
            for i in pending
        ]
        context = Context(seed=run.passes)
        if greedy:
            outcomes = _greedy_pass(candidates, index, context, now, policy)
        else:
            inputs = PassInputs(candidates, index, context, now * 1000, list(running.values()))
            rules = Rules(backfill=backfill, preemption=False, depth=backfill_depth)
            outcomes = schedule(inputs, policy, rules)
        run.passes += 1
        if observe is not None:
            observe(now, outcomes)
        started_now = set()
        for outcome in outcomes:
            if not isinstance(outcome, Placed):
                continue
            number = int(outcome.candidate.job_id)
            task = tasks[number]
            holding = Holding(
                outcome.candidate.job_id,
                outcome.placement.replicas,
                (now + task.time_limit_s) * 1000,
                task.priority_class,
                order=run.passes,
            )
            running[number] = holding
            allocated += holding.gpu_milli
            heapq.heappush(ends, (now + task.runtime_s, number))
            wait = now - task.arrival_s
            run.waits_s.append(wait)
            run.waits_by_class.setdefault(task.priority_class, []).append(wait)
            run.wait_of[number] = wait
            run.nodes_of[number] = nodes_of(outcome.placement)
            run.backfilled += outcome.backfilled
            started_now.add(number)
        if started_now:
            pending = [i for i in pending if i not in started_now]
        run.allocated.append((now, allocated))
    run.makespan_s = now
    run.seconds = time.perf_counter() - started
    return run


def _greedy_pass(
    candidates: list[Candidate], index: NodeIndex, context: Context, now: int, policy: Policy
) -> list[Outcome]:
    """The control (`GREEDY`): each job in queue order is a pass of its own, so no
    reservation outlives it; one placed after a job that waits counts as backfilled."""
    outcomes: list[Outcome] = []
    waiting = False
    for candidate in candidates:
        inputs = PassInputs([candidate], index, context, now * 1000, [])
        for outcome in schedule(inputs, policy, Rules(backfill="off", preemption=False)):
            if isinstance(outcome, Placed):
                outcome = replace(outcome, backfilled=waiting)
            else:
                waiting = True
            outcomes.append(outcome)
    return outcomes


def nodes_of(placement: Placement) -> tuple[str, ...]:
    """The nodes a placement uses: its hosts and the nodes that lend it GPUs, sorted."""
    found = {r.host for r in placement.replicas}
    found.update(piece.node for r in placement.replicas for piece in r.slices)
    return tuple(sorted(found))

"""What a placement cycle reads from the folded state, as the scheduler sees it.

The views of the nodes, each pending job as a `Candidate`, what placed and running
jobs hold and until when, the recorded reservation, the typical workload of
fragmentation-aware policies, and the log's time in the scheduler's integer
milliseconds. Each is a pure function of the state; `pass_inputs` gathers them for
the reference pass (`placement_cycle` without a kept index; the fast twin's are
`IndexCache.pass_inputs`), `cycle` decides with them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime, timedelta

from gpuloom.events import REPLICA_NUMBERS_PER_REPLICA, JobSpec, QueuePolicySet
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.placement.candidate import Candidate
from gpuloom.placement.elastic import Growth, one_more, per_replica
from gpuloom.placement.engine import Context, NodeIndex, Policy
from gpuloom.placement.fences import fences_of
from gpuloom.placement.fragmentation import Shape, Workload
from gpuloom.placement.holdings import Holding
from gpuloom.placement.reservation import Reservation
from gpuloom.placement.resources import GpuView, NodeView, Pool, ReplicaPlacement, Request, Slice
from gpuloom.placement.scarcity import with_scarcity
from gpuloom.placement.scheduling import PassInputs, Rules
from gpuloom.queueing.classes import may_preempt
from gpuloom.queueing.order import queue_order, quota_book, upfront_demand
from gpuloom.state import ClusterState, JobState
from gpuloom.state.model import RECENT_SPECS_KEPT, NodeState

#: How many of the latest submitted jobs make the typical workload (ended ones
#: included: the state keeps their specs, `ClusterState.recent_specs`).
WORKLOAD_WINDOW = RECENT_SPECS_KEPT


def node_views(
    state: ClusterState, *, idle: bool = False, include_lost: bool = False
) -> list[NodeView]:
    """Ready, uncordoned nodes with what is free on them, ranked by name (the tie-break).

    `idle` shows every node as if nothing ran on it and `include_lost` adds lost
    and cordoned nodes (they may come back): what admission asks about, "could
    this ever run", and what explain gives a verdict on.
    """
    views = []
    for rank, name in enumerate(sorted(state.nodes)):
        node = state.nodes[name]
        if include_lost or schedulable(node):
            views.append(node_view(node, rank, idle=idle))
    return views


def schedulable(node: NodeState) -> bool:
    """Placement may use the node: ready and not cordoned."""
    return node.schedulable


def node_view(node: NodeState, rank: int, *, idle: bool = False) -> NodeView:
    """What is free on `node` (all of it with `idle`), as placement sees it. A GPU out
    of service (GpuUnhealthy) has nothing free, unless `idle` (what could ever run)."""
    # every cycle views every GPU of every node (40,000 at 5,000 nodes): what is free
    # is summed in one pass over each GPU's holders, not two
    gpus = []
    unhealthy = node.unhealthy
    for index, gpu in sorted(node.gpus.items()):
        milli, memory = MILLI_PER_GPU, gpu.memory_mib
        if unhealthy and index in unhealthy and not idle:
            milli = memory = 0
        elif not idle:
            for held_milli, held_memory in gpu.holders.values():
                milli -= held_milli
                memory -= held_memory
        pool: Pool = "vgpu" if gpu.pool == "vgpu" else "physical"
        gpus.append(GpuView(gpu.index, gpu.uuid, gpu.model, pool, gpu.memory_mib, milli, memory))
    spec = node.spec
    cpu_used = memory_used = 0
    if not idle:
        for held_cpu, held_memory in node.hosted.values():
            cpu_used += held_cpu
            memory_used += held_memory
    return NodeView(
        name=node.name,
        rank=rank,
        gpus=gpus,
        cpu_free_milli=spec.cpu_milli - cpu_used if spec.cpu_milli else None,
        memory_free_mib=spec.memory_mib - memory_used if spec.memory_mib else None,
        labels=dict(spec.labels),
        lends_remote_vgpu=spec.lends_remote_vgpu,
        runtimes=tuple(spec.runtimes),
        topology={place.level: place.domain for place in spec.topology},
    )


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
        replicas=spec.least_replicas,
        container=spec.image is not None,
        kubernetes=spec.kubernetes is not None,
        topology=(spec.topology.level, spec.topology.mode) if spec.topology else None,
    )


def typical_workload(
    state: ClusterState, every: int = 1, window: int = WORKLOAD_WINDOW
) -> Workload:
    """The shapes of the latest `window` jobs submitted up to the last multiple of
    `every` submissions (before the first `every`: up to the last power of two), FGD's
    typical workload, with the GPU models scarce on the cluster's schedulable nodes
    (`gpuloom.placement.scarcity`). So it changes at most once per `every` submissions, and a policy
    that scores against it keeps its scores in between (`IndexCache`).

    The state keeps the latest specs (`recent_specs`), trimmed by RECENT_SPECS_KEPT
    at a time, so their number equals the count of submissions modulo
    RECENT_SPECS_KEPT, and so modulo `every`, one of its divisors; fewer than `every`
    of them means fewer submissions ever.
    """
    workload = typical_shapes(workload_specs(state, every, window))
    return with_scarcity(workload, schedulable_gpu_models(state))


def workload_specs(
    state: ClusterState, every: int = 1, window: int = WORKLOAD_WINDOW
) -> list[JobSpec]:
    """The specs `typical_workload` reads, in submission order."""
    if RECENT_SPECS_KEPT % every:
        raise ValueError(f"the workload's cadence {every} does not divide {RECENT_SPECS_KEPT}")
    specs = state.recent_specs
    upto = _last_reading(len(specs), every)
    return specs[max(0, upto - min(window, RECENT_SPECS_KEPT)) : upto]


def typical_shapes(specs: Iterable[JobSpec]) -> Workload:
    """FGD's typical workload of these specs (without the scarce models)."""
    return Workload.typical(Shape.of(request_of(spec)) for spec in specs)


def schedulable_gpu_models(state: ClusterState) -> Iterator[str]:
    """The model of each GPU placement may use (ready, uncordoned nodes): the supply
    that `scarce` is measured against (counted, so their order does not matter)."""
    for node in state.nodes.values():
        if node.phase == "ready" and not node.cordoned:
            for gpu in node.spec.gpus:
                yield gpu.model


def _last_reading(count: int, every: int) -> int:
    """How many of `count` specs the workload is read from: a multiple of `every`, or
    (fewer than `every` so far) a power of two, so the first jobs have one soon."""
    if count >= every:
        return count - count % every
    return 1 << (count.bit_length() - 1) if count else 0


def context_for(state: ClusterState, policy: Policy, position: int) -> Context:
    workload = typical_workload(state, policy.workload_every) if policy.needs_workload else None
    return Context(seed=state.seq, position=position, workload=workload)


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_MS = timedelta(milliseconds=1)


def to_ms(moment: datetime) -> int:
    """The log's time as the scheduler's integer milliseconds (exact both ways)."""
    return (moment - EPOCH) // _MS


#: The last millisecond a datetime can hold: a later time is "never".
LAST_MS = (datetime.max.replace(tzinfo=UTC) - EPOCH) // _MS


def from_ms(ms: int) -> datetime:
    """The scheduler's milliseconds as the log's time; past year 9999 is year 9999's
    end (a reservation that far out means "not in any foreseeable future", and
    must not raise OverflowError in every placement cycle)."""
    return EPOCH + min(ms, LAST_MS) * _MS


def holdings_of(state: ClusterState) -> list[Holding]:
    """What placed and running jobs hold, and when they will let go of it at the latest.

    A job ends by its start (or placement, before it started) plus its time
    limit; a preempted one as soon as it was told to stop (its grace period is
    short, and its resources are spoken for). Lost nodes' jobs are requeued by
    the fold, so everything here is on known nodes.
    """
    on_node = {job_id for jobs in state.on_node.values() for job_id in jobs}
    ordered = sorted((state.jobs[j] for j in on_node), key=lambda j: (j.placed_seq, j.job_id))
    return [holding_of(state, job, began_of(job)) for job in ordered]


def began_of(job: JobState) -> datetime | None:
    """When the job's time limit began: its run's start, or its placement before that."""
    run = job.current_run()
    return run.started_at if run is not None else job.placed_at


def on_a_node(state: ClusterState, job: JobState) -> bool:
    """What `holdings_of` counts as running: the job is on one of the nodes it holds."""
    on_node = state.on_node
    return any(job.job_id in on_node.get(name, ()) for name in job.nodes_held())


def placement_order(holding: Holding) -> tuple[int, str]:
    return (holding.order, holding.job_id)


def holding_of(state: ClusterState, job: JobState, began: datetime | None) -> Holding:
    limit = job.spec.time_limit_s
    ends = to_ms(began) + 1000 * limit if limit is not None and began is not None else None
    if job.preempted_at is not None:
        ends = to_ms(job.preempted_at)
    replicas, numbers = [], []
    for number, replica in job.held_replicas():
        numbers.append(number)
        slices = []
        for piece in replica.slices:
            node = state.nodes.get(piece.node)
            gpu = node.gpus.get(piece.index) if node is not None else None
            memory = gpu.slice_memory(piece.milli, piece.memory_mib) if gpu else piece.memory_mib
            slices.append(Slice(piece.node, piece.index, piece.uuid, piece.milli, memory))
        replicas.append(
            ReplicaPlacement(replica.host, tuple(slices), replica.cpu_milli, replica.memory_mib)
        )
    return Holding(
        job_id=job.job_id,
        replicas=tuple(replicas),
        ends_at=ends,
        priority_class=job.spec.priority,
        preemptible=job.spec.preemptible,
        account=job.spec.account,
        order=job.placed_seq,
        stopping=job.preempted_by is not None,
        numbers=tuple(numbers),
        keep=shrinkable(job),
    )


def shrinkable(job: JobState) -> int:
    """The replicas a running elastic gang keeps if a preemption shrinks it (its minimum);
    0 when it cannot shrink now (not elastic, not running, stopping, shrinking, or
    ending: a replica of it ended, and holds its GPUs until the others do)."""
    spec = job.spec
    if spec.min_replicas is None or job.phase != "running" or job.leaving:
        return 0
    if any(number not in job.left for number in job.finished_replicas):
        return 0
    if job.preempted_by is not None or job.health_stop is not None or job.cancel_requested:
        return 0
    return spec.min_replicas


def stopping_for(job: JobState) -> str | None:
    """The job that `job` (or some of its replicas) is being stopped for, if any."""
    return job.preempted_by if job.preempted_by is not None else job.shrink_by


def candidate_of(
    job: JobState, awaiting: frozenset[str] = frozenset(), may_preempt: bool = True
) -> Candidate:
    """The scheduler's view of a pending job; `may_preempt` comes from its priority
    class (`gpuloom.queueing.classes.may_preempt`). The fast twin remembers it while
    the job waits (`gpuloom.placement.incremental.candidates`)."""
    spec = job.spec
    return Candidate(
        job_id=job.job_id,
        request=request_of(spec),
        time_limit_s=spec.time_limit_s,
        priority_class=spec.priority,
        account=spec.account,
        demand=upfront_demand(spec),
        preemptible=spec.preemptible,
        awaiting_victims=job.job_id in awaiting,
        user=spec.user,
        may_preempt=may_preempt,
        reservation=spec.reservation,
        extra=spec.replicas - spec.least_replicas,
    )


#: How a pass's candidate is made: `candidate_of`, or a twin that remembers them.
MakeCandidate = Callable[[JobState, frozenset[str], bool], Candidate]


def current_reservation(state: ClusterState) -> Reservation | None:
    """The recorded reservation, while its job still waits in the queue."""
    event = state.reservation
    if event is None or event.job_id not in state.queued:
        return None
    return Reservation(
        event.job_id,
        to_ms(event.start_at) if event.start_at is not None else None,
        tuple(
            ReplicaPlacement(
                r.host,
                tuple(Slice(p.node, p.index, p.uuid, p.milli, p.memory_mib) for p in r.slices),
                r.cpu_milli,
                r.memory_mib,
            )
            for r in event.replicas
        ),
    )


def rules_of(state: ClusterState, limit: int = 10_000) -> Rules:
    """What the log's queue policy lets a pass do (its defaults before any)."""
    policy = state.queue_policy or QueuePolicySet()
    return Rules(policy.backfill, policy.preemption, limit, policy.backfill_depth)


def awaiting_victims(state: ClusterState) -> frozenset[str]:
    """The jobs that preempted a job still on a node: they wait for it to stop."""
    return frozenset(
        by
        for jobs in state.on_node.values()
        for job_id in jobs
        if (by := stopping_for(state.jobs[job_id])) is not None
    )


def candidates(
    state: ClusterState,
    jobs: Iterable[JobState],
    awaiting: frozenset[str],
    make: MakeCandidate = candidate_of,
) -> Iterator[Candidate]:
    """`jobs` as the pass sees them, made as the pass asks for them (a pass that stops
    early never builds the rest of a long queue)."""
    classes: dict[str | None, bool] = {}  # whether each priority class may preempt
    for job in jobs:
        allowed = classes.get(job.spec.priority_class)
        if allowed is None:
            allowed = classes[job.spec.priority_class] = may_preempt(state, job.spec)
        yield make(job, awaiting, allowed)


def growable_of(state: ClusterState) -> list[Growth]:
    """The running elastic gangs that may take more replicas now, in submission order:
    their rendezvous is known, nothing stops them or a part of them, none of their
    replicas has ended (but those a shrink ended), and they have fewer than their
    maximum (an advance reservation's gangs keep to what they have)."""
    grows = []
    for job in sorted((state.jobs[j] for j in state.elastic), key=lambda job: job.order):
        spec = job.spec
        if (
            job.phase != "running"
            or job.master is None
            or stopping_for(job) is not None
            or job.health_stop is not None
            or job.cancel_requested
            or spec.reservation is not None
            or any(n not in job.left for n in job.finished_replicas)  # it is ending
        ):
            continue
        numbered = REPLICA_NUMBERS_PER_REPLICA * spec.replicas - len(job.replicas)
        missing = min(spec.replicas - len(job.held_replicas()), numbered)
        if missing <= 0:
            continue
        request = request_of(spec)
        domain = None
        if spec.topology is not None and spec.topology.mode == "required":
            host = state.nodes.get(job.replicas[0].host)
            name = host.spec.domain(spec.topology.level) if host is not None else None
            if name is None:
                continue
            domain = (spec.topology.level, name)
        grows.append(
            Growth(
                job_id=job.job_id,
                request=one_more(request, domain),
                missing=missing,
                first=len(job.replicas),
                account=spec.account,
                user=spec.user,
                unit=per_replica(upfront_demand(spec), spec.least_replicas),
            )
        )
    return grows


def pass_inputs(state: ClusterState, policy: Policy) -> PassInputs | None:
    """What the reference pass reads, made afresh from `state` (None: no node to place on)."""
    views = node_views(state)
    if not views:
        return None
    return PassInputs(
        candidates=candidates(state, queue_order(state), awaiting_victims(state)),
        index=NodeIndex(views),
        context=context_for(state, policy, 0),
        now=log_ms(state),
        holdings=lambda: holdings_of(state),  # built only if a job is blocked
        quotas=quota_book(state),
        current=current_reservation(state),
        fences=fences_of(state),
        growable=lambda: growable_of(state),
    )


def log_ms(state: ClusterState) -> int:
    """The log's time as the pass counts it (0 before any event with a time)."""
    return to_ms(state.clock) if state.clock is not None else 0

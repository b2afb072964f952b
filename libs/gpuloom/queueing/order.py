"""The queue's order and the quotas' book, pure queries of the folded state.

Which queued jobs placement may place and in what order (`queue_order`), whether a
job's dependencies are met (`dependency_status`), and what every account and
identity holds against its quotas (`quota_book`). Placement, explain, the queue's
decision and the read model all ask these; none of them decides anything.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from gpuloom.events import JobSpec, QueuePolicySet
from gpuloom.events.accounts import GPU_MILLI, GPUS, model_resource, pool_resource
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.queueing import (
    PriorityFactors,
    PriorityWeights,
    fair_share_factors,
    multifactor_priority,
)
from gpuloom.queueing.priority import FACTOR_SCALE
from gpuloom.queueing.quota import Quota, QuotaBook, QuotaTracker
from gpuloom.state import ClusterState, JobState
from gpuloom.state.dependencies import dependency_status

_Ranked = TypeVar("_Ranked")


QueueKey = tuple[int, int, int, tuple[int, int, str]]


def queue_key(job: JobState, fair: bool) -> QueueKey:
    """Total order of pending jobs: higher priority first, then a job requeued because
    a GPU failed under it (`JobState.expedited`: first among its priority), then, under
    fair queuing (`fair_queuing(state)`), the job's tag (`JobState.queue_tag`: users
    take turns), then submission order (`JobState.order`: an array's tasks by index),
    then id."""
    return (-job.priority, 0 if job.expedited else 1, job.queue_tag if fair else 0, job.order)


def ranking_total(job: JobState, factors: PriorityFactors, weights: PriorityWeights) -> int:
    """The points a job ranks by under multifactor priority: its total, or for a job
    requeued because a GPU failed under it (expedited), the most any job of its
    priority can have (every factor at 1), so it goes first among them."""
    if not job.expedited:
        return factors.total
    most = weights.age + weights.fair_share + weights.size
    return (job.priority + most) * FACTOR_SCALE


def fair_queuing(state: ClusterState) -> bool:
    """Whether the log's queue policy has users take turns at equal priority."""
    return state.queue_policy is not None and state.queue_policy.fair_queuing


def priority_weights(state: ClusterState) -> PriorityWeights:
    """The weights of the log's QueuePolicySet (all 0, plain priority, before any)."""
    policy = state.queue_policy or QueuePolicySet()
    return PriorityWeights(
        age=policy.weight_age,
        fair_share=policy.weight_fair_share,
        size=policy.weight_size,
        max_age_s=policy.max_age_s,
    )


def pending_in_order(state: ClusterState) -> list[tuple[JobState, PriorityFactors]]:
    """Queued jobs with their priority factors, best first; dependencies not checked.

    Time is the log's clock (the latest `at` folded), fair share is per account
    (decayed usage against shares normalised down the account tree; an account
    no admin created is a top-level one with 1 share), size is GPU
    demand against every registered GPU.
    """
    weights = priority_weights(state)
    jobs = [state.jobs[j] for j in state.queued]
    now = state.clock
    accounts = state.job_accounts | set(state.accounts)  # every account a job named
    shares = {
        name: state.accounts[name].shares if name in state.accounts else 1
        for name in sorted(accounts)
    }
    parents = {name: account.parent for name, account in sorted(state.accounts.items())}
    factors = fair_share_factors(
        state.decayed_usage, shares, now.timestamp() if now else 0.0, parents
    )
    capacity = MILLI_PER_GPU * sum(len(node.gpus) for node in state.nodes.values())
    ranked = []
    for job in jobs:
        spec = job.spec
        ranked.append(
            (
                job,
                multifactor_priority(
                    weights,
                    priority=job.priority,
                    waited_s=(now - job.submitted_at).total_seconds() if now else 0.0,
                    fair_share=factors.get(spec.account, 1.0),
                    gpu_milli_demand=spec.gpus * spec.share_milli * spec.least_replicas,
                    cluster_gpu_milli=capacity,
                ),
            )
        )
    fair = fair_queuing(state)
    ranked.sort(
        key=lambda pair: (
            -ranking_total(pair[0], pair[1], weights),
            0 if pair[0].expedited else 1,
            pair[0].queue_tag if fair else 0,
            pair[0].order,
        )
    )
    return behind_their_preemptors(state, ranked, lambda pair: pair[0])


def behind_their_preemptors(
    state: ClusterState, ranked: list[_Ranked], job_of: Callable[[_Ranked], JobState]
) -> list[_Ranked]:
    """`ranked` (every queued job) with each requeued victim that ranks before the job it
    was preempted for moved right behind that job, when the log's queue policy says so
    (`QueuePolicySet.victims_yield`); the rest keep their ranks.

    What was freed for a job goes to it: the victim placed first would be preempted
    again, and again (a cycle of jobs yielding to each other keeps its ranks). Only the
    fold's few `queued_yielding` are looked at until one must move: a deep backlog is
    not walked for them at every cycle."""
    if not victims_may_yield(state):
        return ranked
    preemptor_of = {job_id: state.jobs[job_id].yields_to for job_id in state.queued_yielding}
    yielding = {
        job_id: preemptor
        for job_id, preemptor in preemptor_of.items()
        if preemptor in state.queued and not _yields_to_itself(job_id, preemptor_of)
    }
    if not yielding:
        return ranked
    ordered: list[_Ranked] = []
    emitted: set[str] = set()
    behind: dict[str, list[_Ranked]] = {}  # preemptor -> victims seen before it, by rank

    def emit(item: _Ranked) -> None:
        stack = [item]
        while stack:
            current = stack.pop()
            ordered.append(current)
            emitted.add(job_of(current).job_id)
            stack.extend(reversed(behind.pop(job_of(current).job_id, [])))

    for item in ranked:
        preemptor = yielding.get(job_of(item).job_id)
        if preemptor is not None and preemptor not in emitted:
            behind.setdefault(preemptor, []).append(item)
        else:
            emit(item)
    return ordered


def victims_may_yield(state: ClusterState) -> bool:
    """Whether `behind_their_preemptors` may move a job: the log's policy lets victims
    yield, and some queued job was preempted for a job that is queued too."""
    policy = state.queue_policy
    if policy is None or not policy.victims_yield:
        return False
    jobs, queued = state.jobs, state.queued
    return any(jobs[job_id].yields_to in queued for job_id in state.queued_yielding)


def yields_to(state: ClusterState, job: JobState) -> str | None:
    """The job `job` waits behind because it was preempted for it, while that job
    waits too (`behind_their_preemptors`; what the queue listing and explain say)."""
    policy = state.queue_policy
    if policy is None or not policy.victims_yield or job.yields_to not in state.queued:
        return None
    return job.yields_to


def _yields_to_itself(job_id: str, preemptor_of: dict[str, str | None]) -> bool:
    """Following who yields to whom from `job_id` comes back to it: jobs that yield
    to each other (quota reclaims both ways) keep their ranks."""
    seen = {job_id}
    current = preemptor_of.get(job_id)
    while current is not None and current in preemptor_of:
        if current in seen:
            return current == job_id
        seen.add(current)
        current = preemptor_of[current]
    return False


def gpu_demand(job: JobState) -> int:
    """Milli-GPU the job holds when placed (all replicas)."""
    return job.spec.gpus * job.spec.share_milli * job.spec.least_replicas


def upfront_demand(spec: JobSpec) -> dict[str, int]:
    """What a job takes of the quota resources known before placement."""
    whole = spec.gpus * spec.least_replicas if spec.gpu_milli is None else 0
    return {GPU_MILLI: spec.gpus * spec.share_milli * spec.least_replicas, GPUS: whole}


def held_demand(state: ClusterState, job: JobState) -> dict[str, int]:
    """What a placed or running job holds of every quota resource."""
    demand: dict[str, int] = {GPU_MILLI: 0, GPUS: 0}
    for _, replica in job.held_replicas():
        for piece in replica.slices:
            node = state.nodes.get(piece.node)
            gpu = node.gpus.get(piece.index) if node is not None else None
            demand[GPU_MILLI] += piece.milli
            demand[GPUS] += 1 if piece.milli >= MILLI_PER_GPU else 0
            if gpu is not None:
                for key in (model_resource(gpu.model), pool_resource(gpu.pool)):
                    demand[key] = demand.get(key, 0) + piece.milli
    return demand


def quota_book(state: ClusterState) -> QuotaBook:
    """Every quota of the log's accounts, every identity's `max_gpus` (LimitsSet), the
    users' limit on jobs placed and not started (`unstarted_per_node`), and what their
    placed and running jobs hold now."""
    resources = sorted({r for a in state.accounts.values() for r in a.quotas})
    book = QuotaBook()
    per_node = state.queue_policy.unstarted_per_node if state.queue_policy else None
    if per_node is not None:
        schedulable = sum(1 for node in state.nodes.values() if node.schedulable)
        book.unstarted_per_node = per_node
        book.unstarted_cap = per_node * max(1, schedulable)
        for job_id in state.placed:  # counts: the order does not matter
            user = state.jobs[job_id].spec.user
            book.unstarted[user] = book.unstarted.get(user, 0) + 1
    for resource in resources:
        quotas = {}
        for name, account in sorted(state.accounts.items()):
            nominal, limit, cap = account.quotas.get(resource, (None, None, None))
            quotas[name] = Quota(account.parent, nominal, limit, cap)
        book.trackers[resource] = QuotaTracker(quotas, {}, resource)
    for identity, limits in sorted(state.limits.items()):
        if limits.max_gpus is not None:
            book.identity_caps[identity] = MILLI_PER_GPU * limits.max_gpus
    if not resources and not book.identity_caps:
        return book
    on_node = sorted({job_id for jobs in state.on_node.values() for job_id in jobs})
    for job_id in on_node:  # what is held now; sums do not depend on the order
        job = state.jobs[job_id]
        book.hold(job.spec.account, held_demand(state, job), user=job.spec.user)
    return book


def queue_order(state: ClusterState) -> list[JobState]:
    """Queued jobs that placement may place (dependencies met), in queue order."""
    if priority_weights(state).plain:
        fair = fair_queuing(state)
        by_key = sorted((state.jobs[j] for j in state.queued), key=lambda j: queue_key(j, fair))
        return placeable(state, by_key)
    return placeable(state, [job for job, _ in pending_in_order(state)], reorder=False)


def placeable(
    state: ClusterState, ranked: list[JobState], *, reorder: bool = True
) -> list[JobState]:
    """Of the queued jobs `ranked` (by `queue_key` when `reorder`: each victim then goes
    behind the job it yields to), those placement may place: not being cancelled, their
    dependencies met."""
    return list(placeable_in_turn(state, ranked, reorder=reorder))


def placeable_in_turn(
    state: ClusterState, ranked: Iterable[JobState], *, reorder: bool = True
) -> Iterator[JobState]:
    """`placeable`, one job at a time as they are asked for: a placement pass that stops
    early (its backfill depth, its limit) does not look at the rest of a deep backlog.
    The state must not change while it is being read."""
    if reorder and victims_may_yield(state):
        ranked = behind_their_preemptors(state, list(ranked), lambda job: job)
    for job in ranked:
        if not job.cancel_requested and (
            not job.spec.depends_on or dependency_status(state, job.spec.depends_on)[0] == "met"
        ):
            yield job

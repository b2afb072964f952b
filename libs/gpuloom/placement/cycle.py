"""One placement cycle: place pending jobs in queue order with one policy.

What it reads from the state (views, candidates, holdings, the typical workload)
is `gpuloom.placement.inputs`; this module decides and writes the events.

The cycle is a pure function of the folded state. Its decisions record the
sequence the state was folded to (`basis_seq`), their position in the cycle and
the policy (name, version, parameters), so that folding the log to `basis_seq`
and running the cycle again reproduces them exactly: that is what
`gpuloom audit` checks. The seed of seeded policies is `basis_seq` and the
typical workload of fragmentation-aware ones is derived from the jobs in the
state, so nothing outside the log enters a decision.
"""

from __future__ import annotations

from datetime import datetime

from gpuloom.events import (
    Decision,
    JobGrown,
    JobPlaced,
    JobPreempted,
    JobReserved,
    JobShrunk,
    PolicyRef,
    ReplicaAssignment,
    SliceRef,
    intents,
)
from gpuloom.placement.elastic import Grown
from gpuloom.placement.engine import NodeIndex, Policy
from gpuloom.placement.incremental.index_cache import IndexCache
from gpuloom.placement.inputs import (
    candidate_of,
    context_for,
    from_ms,
    holdings_of,
    node_views,
    pass_inputs,
    rules_of,
)
from gpuloom.placement.outcomes import Placed, Preempted, Reserved
from gpuloom.placement.resources import (
    Placement,
)
from gpuloom.placement.scheduling import find_reservation, schedule
from gpuloom.state import ClusterState, JobState


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


def earliest_start(state: ClusterState, job: JobState, policy: Policy) -> datetime | None:
    """When the scheduler's own reservation search (`find_reservation`) would start
    `job`, if the jobs placed and running now end at their time limits and nothing
    else is placed: gangs, remote slices and placed jobs not started yet included.
    None: not foreseeable (it waits for jobs without a time limit, or for a node)."""
    found = find_reservation(
        candidate_of(job), NodeIndex(node_views(state)), holdings_of(state), policy,
        context_for(state, policy, 0),
    )  # fmt: skip
    if found is None or found[0].start_at is None:
        return None
    return from_ms(found[0].start_at)


def placement_cycle(
    state: ClusterState,
    policy: Policy,
    limit: int = 10_000,
    *,
    kept: IndexCache | None = None,
) -> list[Decision]:
    """One scheduling pass (`gpuloom.placement.scheduling.schedule`) as events to write.

    Jobs held by quota or dependencies are skipped; the rest are placed,
    preempt, get the reservation or backfill as the log's QueuePolicySet says; running
    elastic gangs grow (JobGrown) and shrink for a preemption (JobShrunk).
    Without `kept` it is the reference pass, on inputs made afresh from the state
    (`inputs.pass_inputs`); `kept` carries what the last cycle read to the next (the
    fast twin: the same decisions, less work, `gpuloom.placement.incremental`).
    """
    inputs = pass_inputs(state, policy) if kept is None else kept.pass_inputs(state, policy)
    if inputs is None:
        return []
    # decisions only: why each job waits is explain's to say (the same pass, with reasons)
    outcomes = schedule(inputs, policy, rules_of(state, limit), reasons=False)
    ref = PolicyRef(name=policy.name, version=policy.version, params=dict(policy.params))
    common = {"basis_seq": state.seq, "policy": ref}
    decisions: list[Decision] = []
    for outcome in outcomes:
        if isinstance(outcome, Placed):
            job = state.jobs[outcome.candidate.job_id]
            event = placed_event(job.job_id, job.attempt + 1, outcome.placement).model_copy(
                update={
                    **common,
                    "cycle_position": outcome.position,
                    "backfilled": outcome.backfilled,
                }
            )
            decisions.append(
                Decision(
                    event, intents.placed(job.job_id, event.attempt, state.seq), job.last_event_id
                )
            )
        elif isinstance(outcome, Preempted):
            for offset, victim in enumerate(outcome.victims):
                job = state.jobs[victim.job_id]
                if victim.shrink:
                    shrunk = JobShrunk(
                        job_id=job.job_id,
                        attempt=job.attempt,
                        replicas=sorted(victim.numbers),
                        by=outcome.candidate.job_id,
                        reason=outcome.reason,
                        cycle_position=outcome.position + offset,
                        **common,
                    )
                    intent = intents.shrunk(job.job_id, job.attempt, state.seq)
                    decisions.append(Decision(shrunk, intent, job.last_event_id))
                    continue
                preempted = JobPreempted(
                    job_id=job.job_id,
                    attempt=job.attempt,
                    by=outcome.candidate.job_id,
                    reason=outcome.reason,
                    cycle_position=outcome.position + offset,
                    **common,
                )
                decisions.append(
                    Decision(
                        preempted, intents.preempted(job.job_id, job.attempt), job.last_event_id
                    )
                )
        elif isinstance(outcome, Grown):
            job = state.jobs[outcome.job_id]
            grown = JobGrown(
                job_id=job.job_id,
                attempt=job.attempt,
                first=outcome.first,
                replicas=placed_event(job.job_id, 1, Placement(outcome.replicas)).replicas,
                cycle_position=outcome.position,
                **common,
            )
            intent = intents.grown(job.job_id, job.attempt, state.seq)
            decisions.append(Decision(grown, intent, job.last_event_id))
        elif isinstance(outcome, Reserved):
            reservation = outcome.reservation
            job = state.jobs[reservation.job_id]
            reserved = JobReserved(
                job_id=job.job_id,
                start_at=from_ms(reservation.start_at)
                if reservation.start_at is not None
                else None,
                replicas=placed_event(job.job_id, 1, Placement(reservation.replicas)).replicas,
                cycle_position=outcome.position,
                **common,
            )
            decisions.append(
                Decision(reserved, intents.reserved(job.job_id, state.seq), job.last_event_id)
            )
    return decisions

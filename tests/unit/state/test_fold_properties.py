"""Random logs, valid and invalid events mixed: the fold's invariants hold after every event,
and what the pure decisions propose is valid on the state they were made from.

A log is played from a random list of actions: nodes come, go and change; users submit
and cancel; the services (admission, queue, placement with best fit, accounting) and
node agents take turns; and arbitrary, mostly invalid, events are thrown in. Choices
that depend on the state ("some live job") are drawn as integers and taken modulo
what there is, so that Hypothesis can shrink them.
"""

from __future__ import annotations

import pytest
from fixtures.actions import ACTIONS, ELASTIC, MODELS, PREEMPTING
from fixtures.world import World
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuloom.events import JobFinished, JobShrunk, JobStarted, PriorityClassSet
from gpuloom.placement import BestFit, placement_cycle
from gpuloom.testing.builders import LogBuilder


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    models=st.lists(st.sampled_from(MODELS), min_size=2, max_size=3),
    gpus=st.integers(1, 4),
    actions=st.lists(ACTIONS, min_size=25, max_size=60),
    victims_yield=st.booleans(),
    backfill_depth=st.none() | st.integers(1, 3),
    fair_queuing=st.booleans(),
    unstarted_per_node=st.none() | st.integers(1, 2),
)
def test_random_logs_keep_every_invariant(
    models: list[str],
    gpus: int,
    actions: list[object],
    victims_yield: bool,
    backfill_depth: int | None,
    fair_queuing: bool,
    unstarted_per_node: int | None,
) -> None:
    world = World(models, gpus, victims_yield, backfill_depth, fair_queuing, unstarted_per_node)
    for action in actions:
        world.play(action)
    world.check_replay()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.integers(1, 4),
    actions=st.lists(PREEMPTING, min_size=25, max_size=60),
    victims_yield=st.booleans(),
    fair_queuing=st.booleans(),
    unstarted_per_node=st.none() | st.integers(1, 2),
)
def test_random_preemptions_keep_every_invariant(
    gpus: int,
    actions: list[object],
    victims_yield: bool,
    fair_queuing: bool,
    unstarted_per_node: int | None,
) -> None:
    """Most of these logs preempt (jobs of mixed priorities, half of them preemptible,
    on full nodes), and victims requeue and yield: every decision stays valid, the
    audit property and a kept index hold (`World.place`), and the log replays."""
    world = World(
        ["A100", "H100"],
        gpus,
        victims_yield,
        fair_queuing=fair_queuing,
        unstarted_per_node=unstarted_per_node,
    )
    for action in actions:
        world.play(action)
    world.check_replay()


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gpus=st.integers(1, 4),
    actions=st.lists(ELASTIC, min_size=25, max_size=60),
    victims_yield=st.booleans(),
)
def test_random_elastic_gangs_keep_every_invariant(
    gpus: int, actions: list[object], victims_yield: bool
) -> None:
    """Elastic gangs among jobs of one replica, on a cluster that fills and empties
    (`Lull`): gangs start with what fits, their replicas one by one once replica 0's
    rendezvous is known, grow (JobGrown) when nothing waits, shrink (JobShrunk) for a
    job of a higher priority and end the replicas told to leave; every decision stays
    valid, the kept index decides as a fresh one, and the log replays."""
    world = World(["A100", "H100"], gpus, victims_yield)
    for action in actions:
        world.play(action)
    world.check_replay()


@pytest.mark.parametrize("ended", [0, 1])
def test_a_gang_with_a_replica_that_ended_is_shrunk_validly(ended: int) -> None:
    """An elastic gang of 1 to 2 replicas runs both on n1's 2 GPUs; replica `ended` ends
    on its own (its GPU held until the gang's run ends); a job of a higher priority
    comes: whatever placement decides is valid where it decided it."""
    log = LogBuilder()
    log.append(PriorityClassSet(name="urgent", priority=100))
    log.register("n1", 2)
    log.run_to_queue("el", gpus=1, replicas=2, min_replicas=1, preemptible=True)
    log.record_decisions(placement_cycle(log.state(), BestFit()))
    rendezvous = {"master_addr": "10.0.0.1", "master_port": 29500}
    log.append(JobStarted(job_id="el", attempt=1, node="n1", replica=0, **rendezvous))
    log.append(JobStarted(job_id="el", attempt=1, node="n1", replica=1))
    log.append(
        JobFinished(
            job_id="el", attempt=1, node="n1", replica=ended, outcome="succeeded", exit_code=0
        )
    )
    log.run_to_queue("urgent", gpus=1, priority=100, priority_class="urgent")
    decisions = placement_cycle(log.state(), BestFit())
    log.record_decisions(decisions)
    state = log.state()
    voided = [v.reason for v in state.recent_voided]
    assert not voided, (voided, [d.event for d in decisions if isinstance(d.event, JobShrunk)])

"""Random logs, valid and invalid events mixed: the fold's invariants hold after every event,
and what the pure decisions propose is valid on the state they were made from.

A log is played from a random list of actions: nodes come, go and change; users submit
and cancel; the services (admission, queue, placement with best fit, accounting) and
node agents take turns; and arbitrary, mostly invalid, events are thrown in. Choices
that depend on the state ("some live job") are drawn as integers and taken modulo
what there is, so that Hypothesis can shrink them.
"""

from __future__ import annotations

from fixtures.actions import ACTIONS, MODELS, PREEMPTING
from fixtures.world import World
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st


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

"""Placement: the policy registry, best fit, and one placement cycle."""

from __future__ import annotations

import pytest
from fixtures.checks import check_invariants

from gpuloom.decide.explain import explain
from gpuloom.events import JobPlaced, JobReserved, NodeCordoned, NodeUncordoned, PolicyRef
from gpuloom.placement import (
    BestFit,
    PolicyRegistry,
    default_registry,
    node_views,
    placement_cycle,
)
from gpuloom.testing.builders import LogBuilder, make_gpus

# --- registry -------------------------------------------------------------------------


def test_the_default_registry_holds_every_shipped_policy() -> None:
    registry = default_registry()
    assert registry.names() == ["bestfit", "dotprod", "fgd", "loom", "pack", "random", "spread"]
    assert isinstance(registry.get("bestfit"), BestFit)


def test_the_registry_refuses_a_duplicate_name() -> None:
    registry = PolicyRegistry()
    registry.register(BestFit())
    with pytest.raises(ValueError, match="already registered"):
        registry.register(BestFit())


def test_an_unknown_policy_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: bestfit, dotprod"):
        default_registry().get("tetris")


def cluster() -> LogBuilder:
    """n1: 4 x A100 (GPU 0 busy), n2: 2 x A100, n3: 2 x H100, n4 lost."""
    log = LogBuilder()
    log.register("n1", 4, "A100-80GB")
    log.register("n2", 2, "A100-80GB")
    log.register("n3", 2, "H100-80GB")
    log.register("n4", 8, "A100-80GB")
    log.lose("n4")
    log.run_to_queue("busy", gpus=1)
    log.place("busy", "n1", [0])
    return log


def test_node_views_list_ready_nodes_with_their_free_gpus() -> None:
    views = node_views(cluster().state())
    assert [(v.name, v.rank, len(v.gpus), [g.index for g in v.gpus if g.idle]) for v in views] == [
        ("n1", 0, 4, [1, 2, 3]),
        ("n2", 1, 2, [0, 1]),
        ("n3", 2, 2, [0, 1]),
    ]


def test_a_cycle_places_in_queue_order_and_reserves_for_the_blocked_head() -> None:
    log = cluster()
    log.run_to_queue("huge", gpus=4, priority=9)
    log.run_to_queue("h100", gpus=2, gpu_model=["H100-80GB"], priority=5)
    log.run_to_queue("pair", gpus=2)
    log.run_to_queue("triple", gpus=3)
    log.run_to_queue("single", gpus=1)
    state = log.state()
    decisions = placement_cycle(state, BestFit())
    placed = [
        (d.event.job_id, d.event.node, d.event.gpu_indexes)
        for d in decisions
        if isinstance(d.event, JobPlaced)
    ]
    assert placed == [
        ("h100", "n3", [0, 1]),
        ("pair", "n2", [0, 1]),
    ], "huge waits for n1; triple and single (no time limit) would delay it"
    [reserved] = [d.event for d in decisions if isinstance(d.event, JobReserved)]
    assert reserved.job_id == "huge" and reserved.start_at is None
    assert [r.host for r in reserved.replicas] == ["n1"]
    assert [d.event.cycle_position for d in decisions] == [0, 1, 2]  # type: ignore[attr-defined]
    assert reserved.cycle_position == 0 and reserved.basis_seq == state.seq
    for d in decisions[1:]:
        assert isinstance(d.event, JobPlaced)
        assert d.event.basis_seq == state.seq
        assert d.event.backfilled, "placed while huge, ahead of them, could not start"
        assert d.event.attempt == 1
        assert d.event.policy == PolicyRef(name="bestfit", version=2, params={})
        assert d.event.gpu_uuids == [f"GPU-{d.event.node}-{i}" for i in d.event.gpu_indexes]
        assert d.msg_id == f"{d.event.job_id}:placed:1:{state.seq}"
        assert d.causation_id == state.jobs[d.event.job_id].last_event_id


def test_a_cycle_never_over_commits_and_all_its_decisions_apply() -> None:
    log = cluster()
    for i in range(12):
        log.run_to_queue(f"j{i:02d}", gpus=1 + i % 2, priority=i % 3)
    state = log.state()
    decisions = placement_cycle(state, BestFit())
    taken = [
        (d.event.node, i)
        for d in decisions
        if isinstance(d.event, JobPlaced)
        for i in d.event.gpu_indexes
    ]
    assert len(taken) == len(set(taken))
    assert len(taken) == 7, "every free GPU of a ready node is used"
    log.record_decisions(decisions)
    after = log.state()
    assert after.voided == 0
    check_invariants(after, len(log))
    assert placement_cycle(after, BestFit()) == []


def test_re_running_a_cycle_on_the_same_state_gives_the_same_decisions() -> None:
    log = cluster()
    for i in range(6):
        log.run_to_queue(f"j{i}", gpus=i % 3)
    state = log.state()
    first = placement_cycle(state, BestFit())
    assert first
    assert placement_cycle(state, BestFit()) == first
    # An audit: fold the log again up to basis_seq and re-run the policy it names.
    basis = first[0].event.basis_seq  # type: ignore[attr-defined]
    policy = default_registry().get(first[0].event.policy.name)  # type: ignore[attr-defined]
    assert placement_cycle(log.state(upto=basis), policy) == first


def test_a_requeued_job_is_placed_with_its_next_attempt() -> None:
    log = cluster()
    log.run_to_queue("j1", gpus=2, gpu_model=["A100-80GB"])
    log.place("j1", "n2", [0, 1])
    log.lose("n2")
    [decision] = placement_cycle(log.state(), BestFit())
    assert isinstance(decision.event, JobPlaced)
    assert (decision.event.attempt, decision.event.node) == (2, "n1")


def test_a_cycle_honours_its_limit_and_needs_a_ready_node() -> None:
    log = cluster()
    for i in range(4):
        log.run_to_queue(f"j{i}", gpus=1)
    assert len(placement_cycle(log.state(), BestFit(), limit=2)) == 2
    empty = LogBuilder()
    empty.register("gone", gpu_list=make_gpus("gone", 2))
    empty.lose("gone")
    empty.run_to_queue("j1", gpus=0)
    assert placement_cycle(empty.state(), BestFit()) == []


def test_the_placement_service_refuses_an_unknown_policy_name() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "GPULOOM_PLACEMENT_POLICY": "tetris"}
    result = subprocess.run(
        [sys.executable, "-m", "services.placement"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "unknown placement policy 'tetris' (known: bestfit, dotprod, fgd" in result.stderr


def test_a_cordoned_node_takes_no_new_work_and_explain_says_why() -> None:
    log = cluster()
    log.append(NodeCordoned(node="n3", reason="maintenance"))
    log.run_to_queue("h100", gpus=2, gpu_model=["H100-80GB"])
    state = log.state()
    assert [v.name for v in node_views(state)] == ["n1", "n2"]
    assert "n3" in {v.name for v in node_views(state, idle=True, include_lost=True)}
    found = explain(state, "h100")
    assert found is not None and found.nodes["n3"] == "cordoned: maintenance"
    assert found.reason == "Resources"
    decisions = placement_cycle(state, BestFit())
    assert not [d for d in decisions if isinstance(d.event, JobPlaced)]
    log.append(NodeUncordoned(node="n3"))
    log.append(NodeUncordoned(node="n3"))  # not cordoned any more: voided
    state = log.state()
    assert state.voided == 1 and not state.nodes["n3"].cordoned
    [decision] = placement_cycle(state, BestFit())
    assert isinstance(decision.event, JobPlaced) and decision.event.node == "n3"

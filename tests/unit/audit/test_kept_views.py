"""A kept index re-uses the view of each node the log did not change (`IndexCache.views_of`),
and the holding of each job it did not change (`KeptHoldings`).

The fold stamps a node with the sequence of each event that changes what placement
sees of it (`NodeState.changed_seq`). An index cache that only watches the log,
never deciding, must then show after every event exactly the views built afresh:
a rule that changed a node without stamping it would leave a stale view behind. The
same for the holdings of running jobs, stamped by `JobState.last_seq`.
"""

from __future__ import annotations

from core.world import assert_kept_holdings
from hypothesis import HealthCheck, given, settings

from gpuloom.events import JobPlaced
from gpuloom.placement import BestFit, IndexCache, node_views, placement_cycle
from gpuloom.state import ClusterState, apply, fold
from gpuloom.state.snapshot import decode_snapshot, encode_snapshot
from gpuloom.testing.builders import LogBuilder, make_job_spec

from .test_audit import RUN_LOG_ARGUMENTS, node, run_log


def watch(records: list, state: ClusterState | None = None) -> None:  # type: ignore[type-arg]
    """Fold `records` one by one; after each, the watching cache's views are the fresh ones."""
    state = state or ClusterState()
    watching, policy = IndexCache(), BestFit()
    for record in records:
        apply(state, record)
        views = watching.views_of(state)
        assert views == node_views(state), f"after seq {record.seq} ({record.envelope.type})"
        if views:
            watching.index_for(views, policy, None)
        assert_kept_holdings(watching.holdings, state)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**RUN_LOG_ARGUMENTS)
def test_views_kept_from_event_to_event_are_the_views_built_afresh(
    policy: str,
    shapes: list[dict[str, object]],
    finish_every: int,
    pool_moves: list[tuple[str, int]],
) -> None:
    """Placements (remote vGPU slices borrowed from a lending node among them), runs that
    end, and GPUs moved between pools, as the audit's generated logs hold them."""
    watch(run_log(policy, shapes, finish_every, pool_moves).records)


def test_a_view_is_built_again_when_its_node_lends_is_lost_recovered_or_registered_again() -> None:
    """`b` lends a slice to a job hosted on `a` (only `a` has the CPU), so the JobPlaced
    changes a node that does not host it; then `a` is lost and recovers, and the idle
    `c` registers again with more GPUs."""
    log = LogBuilder()
    log.append(node("a", 1, "A100", "vgpu"))
    lender = node("b", 4, "A100", "vgpu", lends=True)
    log.append(
        lender.model_copy(update={"spec": lender.spec.model_copy(update={"cpu_milli": 1000})})
    )
    log.append(node("c", 1, "T4", "physical"))
    log.submit("j1", make_job_spec(2, gpu_milli=300, cpu_milli=8000, locality="any"))
    log.admit("j1")
    log.queue("j1")
    [placed] = log.record_decisions(placement_cycle(log.state(), BestFit()))
    assert isinstance(placed.event, JobPlaced)
    assert {s.node for r in placed.event.assignments() for s in r.slices} == {"a", "b"}
    log.lose("a")
    log.recover("a")
    log.append(node("c", 2, "T4", "physical"))
    watch(log.records)


def test_views_kept_for_one_state_are_not_taken_for_a_state_restored_from_a_snapshot() -> None:
    """A restored node's stamp is 0 (snapshots leave stamps out), so the stamps of two
    state objects do not compare: a cache that watched one restored state starts afresh
    on another, and goes on from a restored state as from a folded one."""
    log = run_log("bestfit", [{"gpus": 1}, {"gpus": 2}, {"gpus": 1, "gpu_milli": 250}], 0)
    early = decode_snapshot(encode_snapshot(fold(log.records[: len(log.records) // 3])))
    watching = IndexCache()
    watching.index_for(watching.views_of(early), BestFit(), None)
    late = decode_snapshot(encode_snapshot(fold(log.records)))
    assert watching.views_of(late) == node_views(late) != node_views(early)
    half = len(log.records) // 2
    watch(log.records[half:], decode_snapshot(encode_snapshot(fold(log.records[:half]))))

"""A kept index re-uses the view of each node the log did not change (`IndexCache.views_of`),
and the holding of each job it did not change (`KeptHoldings`).

The fold says which nodes and jobs each event changed (`Folded.nodes`, `Folded.jobs`),
and a `ChangeFeed` remembers it for the caches. An index cache that only watches the
log, never deciding, must then show after every event exactly the views built afresh:
a rule that changed a node without saying so would leave a stale view behind. The same
for the holdings of running jobs and the queue's order.
"""

from __future__ import annotations

from fixtures.world import assert_kept_holdings, assert_kept_queue, assert_released
from hypothesis import HealthCheck, given, settings

from gpuloom.events import JobPlaced
from gpuloom.placement import BestFit, IndexCache, node_views, placement_cycle
from gpuloom.placement.incremental.holdings import KeptHoldings
from gpuloom.placement.incremental.queue import KeptQueue
from gpuloom.state import ClusterState, apply, fold
from gpuloom.state.changes import ChangeFeed
from gpuloom.state.snapshot import decode_snapshot, encode_snapshot
from gpuloom.testing.builders import LogBuilder, make_job_spec

from .test_audit import RUN_LOG_ARGUMENTS, node, run_log


def watch(records: list, state: ClusterState | None = None) -> None:  # type: ignore[type-arg]
    """Fold `records` one by one; after each, the watching cache's views are the fresh ones."""
    state = state or ClusterState()
    changes = ChangeFeed()
    watching, policy = IndexCache(changes), BestFit()
    for record in records:
        changes.apply(state, record)
        views = watching.views_of(state)
        assert views == node_views(state), f"after seq {record.seq} ({record.envelope.type})"
        if views:
            watching.index_for(views, policy, None)
            assert_released(watching, state)
        assert_kept_holdings(watching.holdings, state)
        assert_kept_queue(watching.queue, state)


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
    """What a feed knows of one state says nothing of another: a cache that watched one
    restored state starts afresh on another, and goes on from a restored state (its
    feed fed from there on) as from a folded one."""
    log = run_log("bestfit", [{"gpus": 1}, {"gpus": 2}, {"gpus": 1, "gpu_milli": 250}], 0)
    early = decode_snapshot(encode_snapshot(fold(log.records[: len(log.records) // 3])))
    watching = IndexCache(ChangeFeed())
    watching.index_for(watching.views_of(early), BestFit(), None)
    late = decode_snapshot(encode_snapshot(fold(log.records)))
    assert watching.views_of(late) == node_views(late) != node_views(early)
    half = len(log.records) // 2
    watch(log.records[half:], decode_snapshot(encode_snapshot(fold(log.records[:half]))))


def fold_many_changes_on(log: LogBuilder, state: ClusterState, seen: int, feed: ChangeFeed) -> None:
    """Fold onto `state`, through `feed`, what `log` holds past its first `seen` records
    and changes to more jobs than the feed remembers: it forgets the oldest."""
    for number in range(feed.most_jobs + 1):
        log.submit(f"other{number}", make_job_spec(1))
    for record in log.records[seen:]:
        feed.apply(state, record)
    assert feed.since > seen, "the feed forgot changes the cache did not see"


def test_a_cache_whose_feed_forgot_what_changed_since_it_looked_reads_every_job_again() -> None:
    """Between two looks of a kept cache, a job it saw running ends, is charged and
    leaves the state, and so many jobs change after it that the feed forgets it: the
    cache cannot know what changed (`ChangeFeed.covers`), and reads every job again."""
    log = LogBuilder()
    log.register("n1", 8)
    for number, job_id in enumerate(["j1", "j2"]):
        log.run_to_queue(job_id, gpus=1)
        log.place(job_id, "n1", [number])
        log.start(job_id, "n1")
    feed = ChangeFeed(most_jobs=8)
    state = feed.fold(ClusterState(), log.records)
    kept = KeptHoldings(feed)
    assert [h.job_id for h in kept.of(state)] == ["j1", "j2"]
    seen = len(log.records)
    log.finish("j1", "n1", after=60)
    log.charge("j1", seconds=60)
    fold_many_changes_on(log, state, seen, feed)
    assert "j1" not in state.jobs
    assert_kept_holdings(kept, state)
    assert [h.job_id for h in kept.of(state)] == ["j2"]


def test_a_kept_queue_whose_feed_forgot_what_changed_sorts_every_job_again() -> None:
    """Between two looks of a kept queue, a job it saw queued is cancelled and leaves
    the state, and the feed forgets it: the queue is sorted again, as `queue_order`
    gives it."""
    log = LogBuilder()
    log.register("n1", 1)
    for job_id in ["j1", "j2"]:
        log.run_to_queue(job_id, gpus=2)  # too big for the node: they stay queued
    feed = ChangeFeed(most_jobs=8)
    state = feed.fold(ClusterState(), log.records)
    kept = KeptQueue(feed)
    assert [job.job_id for job in kept.order(state)] == ["j1", "j2"]
    seen = len(log.records)
    log.cancel("j1")
    fold_many_changes_on(log, state, seen, feed)
    assert_kept_queue(kept, state)
    assert [job.job_id for job in kept.order(state)] == ["j2"]


def test_a_cache_reads_everything_again_after_a_fold_its_feed_did_not_see() -> None:
    """Events folded into the state without the feed (a bug of whoever folds): the feed's
    position is not the state's, so the caches read everything again, never stale."""
    log = LogBuilder()
    log.register("n1", 2)
    for job_id in ["j1", "j2"]:
        log.run_to_queue(job_id, gpus=1)
    feed = ChangeFeed()
    state = feed.fold(ClusterState(), log.records)
    kept, queue = IndexCache(feed), KeptQueue(feed)
    kept.index_for(kept.views_of(state), BestFit(), None)
    assert [job.job_id for job in queue.order(state)] == ["j1", "j2"]
    seen = len(log.records)
    log.place("j1", "n1", [0])
    log.cancel("j2")
    for record in log.records[seen:]:
        apply(state, record)  # not through the feed
    assert not feed.covers(state, seen)
    assert kept.views_of(state) == node_views(state)
    assert_kept_queue(queue, state)
    assert_kept_holdings(kept.holdings, state)


def test_a_job_placed_again_between_two_looks_moves_to_its_new_place_in_the_order() -> None:
    """`j1` runs before `j2`; between two looks its node is lost, comes back, and `j1` is
    placed there again: it now comes after `j2` (placement order), as built afresh."""
    log = LogBuilder()
    for name in ["n1", "n2"]:
        log.register(name, 2)
    for job_id, name in [("j1", "n1"), ("j2", "n2")]:
        log.run_to_queue(job_id, gpus=1)
        log.place(job_id, name, [0])
    feed = ChangeFeed()
    state = feed.fold(ClusterState(), log.records)
    kept = KeptHoldings(feed)
    assert [h.job_id for h in kept.of(state)] == ["j1", "j2"]
    seen = len(log.records)
    log.lose("n1")
    log.recover("n1")
    log.place("j1", "n1", [0], attempt=2)
    feed.fold(state, log.records[seen:])
    assert_kept_holdings(kept, state)
    assert [h.job_id for h in kept.of(state)] == ["j2", "j1"]

"""How often fgd and loom read the typical workload (`inputs.typical_workload`'s cadence).

Version 2 reads it every 100 submissions, so a busy cluster keeps its scores between
two readings; version 1 (retired, for the audit of old logs) read it at every one.
"""

from __future__ import annotations

import pytest

from gpuloom.events import GpuSpec, JobSpec, NodeRegistered, NodeSpec
from gpuloom.placement import IndexCache, default_registry, placement_cycle
from gpuloom.placement.fragmentation import Shape, Workload
from gpuloom.placement.inputs import request_of, typical_workload
from gpuloom.placement.policies.fragmentation_aware import WORKLOAD_EVERY
from gpuloom.state import ClusterState, apply
from gpuloom.state.changes import ChangeFeed
from gpuloom.state.model import RECENT_SPECS_KEPT
from gpuloom.testing.builders import LogBuilder, make_job_spec

#: Shapes that change the typical workload at nearly every submission: a CPU request
#: that grows with the job's number, in 7 distinct classes.
CPU_STEPS = 7


def node(name: str, count: int) -> NodeRegistered:
    gpus = [
        GpuSpec(index=i, uuid=f"{name}-{i}", model="A100", memory_mib=40_960, pool="vgpu")
        for i in range(count)
    ]
    return NodeRegistered(node=name, spec=NodeSpec(gpus=gpus, cpu_milli=64_000))


def spec_of(number: int) -> JobSpec:
    return make_job_spec(1, cpu_milli=1000 * (1 + number % CPU_STEPS), gpu_milli=250)


def expected(specs: list[JobSpec], upto: int) -> Workload:
    """The workload of the 1,000 specs submitted up to the `upto`-th."""
    chosen = specs[max(0, upto - RECENT_SPECS_KEPT) : upto]
    return Workload.typical(Shape.of(request_of(spec)) for spec in chosen)


def test_the_workload_is_read_every_hundred_submissions_and_at_powers_of_two_before() -> None:
    """... and a kept index cache, which counts the shapes again only when the specs read
    changed, reads the same (for both versions, each with its own cache)."""
    log = LogBuilder()
    submitted: list[JobSpec] = []
    state = ClusterState()
    checked = 0
    kept = {version: IndexCache(ChangeFeed()) for version in (1, 2)}
    policies = {version: default_registry().get("fgd", version) for version in (1, 2)}
    for number in range(2_650):  # past the state's trim of its kept specs, at 2,000
        spec = spec_of(number)
        record = log.submit(f"j{number}", spec)
        apply(state, record)
        submitted.append(spec)
        count = number + 1
        around_the_trim = 1_990 <= count <= 2_010 or 2_099 <= count <= 2_101
        if count < 140 or around_the_trim or count % 97 == 0:
            last = count - count % 100 if count >= 100 else 1 << (count.bit_length() - 1)
            assert typical_workload(state, WORKLOAD_EVERY) == expected(submitted, last), count
            assert typical_workload(state) == expected(submitted, count), count  # version 1
            assert kept[2].context_for(state, policies[2]).workload == expected(submitted, last)
            assert kept[1].context_for(state, policies[1]).workload == expected(submitted, count)
            checked += 1
    assert checked > 180


@pytest.mark.parametrize("version", [1, 2])
def test_between_two_readings_the_kept_index_and_its_scores_stay(version: int) -> None:
    """The kept index's workload (what its heaps score with) is replaced exactly when the
    workload is read again: at powers of two, then every 100 submissions; version 1 at
    every one. The index itself is kept (its heaps score their nodes again)."""
    log = LogBuilder()
    log.append(node("a", 4))
    feed = ChangeFeed()
    state = feed.fold(ClusterState(), log.records)
    policy = default_registry().get("fgd", version)
    kept = IndexCache(feed)
    renewed = []
    for number in range(1, 260):
        feed.apply(state, log.submit(f"j{number}", spec_of(number)))
        before, index = kept._workload, kept._index
        placement_cycle(state, policy, limit=0, kept=kept)  # places nothing
        if kept._workload is not before:
            renewed.append(number)
        assert index is None or kept._index is index, "the index is kept"
    if version == 2:
        assert renewed == [1, 2, 4, 8, 16, 32, 64, 100, 200]
    else:
        assert renewed == list(range(1, 260))


def test_a_cadence_that_does_not_divide_the_kept_specs_is_refused() -> None:
    with pytest.raises(ValueError, match="does not divide"):
        typical_workload(ClusterState(), 300)

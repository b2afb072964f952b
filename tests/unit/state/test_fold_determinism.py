"""The fold is deterministic: the same log always gives the same state, from any snapshot."""

from __future__ import annotations

import copy

from fixtures.checks import check_invariants
from fixtures.story import story

from gpuloom.events import decode, encode
from gpuloom.state import ClusterState, fold


def test_the_story_folds_with_three_voided_events() -> None:
    log = story()
    state = log.state()
    assert [v.type for v in state.recent_voided] == ["JobPlaced", "JobSubmitted", "UsageCharged"]
    check_invariants(state, len(log))


def test_folding_the_same_log_twice_gives_equal_states() -> None:
    log = story()
    first, second = fold(log), fold(log)
    assert first is not second
    assert first == second
    assert first != ClusterState()


def test_folding_the_log_read_back_from_the_wire_gives_the_same_state() -> None:
    log = story()
    read_back = [decode(r.seq, encode(r.envelope)) for r in log]
    assert fold(read_back) == fold(log)


def test_folding_on_from_any_snapshot_gives_the_same_state() -> None:
    log = story()
    whole = fold(log)
    for k in range(len(log) + 1):
        snapshot = fold(log[:k])
        assert fold(log[k:], copy.deepcopy(snapshot)) == whole, f"snapshot at {k}"

"""The fold is deterministic: the same log always gives the same state, from any snapshot."""

from __future__ import annotations

import copy

from gpuloom.events import decode, encode
from gpuloom.state import ClusterState, fold
from gpuloom.testing.builders import LogBuilder

from .checks import check_invariants


def story() -> LogBuilder:
    """A log with a bit of everything, voided events included."""
    log = LogBuilder()
    log.register("n1", 4, "A100-80GB")
    log.register("n2", 2, "H100-80GB")
    log.run_to_queue("a", gpus=2, idempotency_key="k-a")
    log.run_to_queue("b", gpus=1, gpu_model=["H100-80GB"], priority=3)
    log.run_to_queue("c", gpus=1)
    log.place("a", "n1", [0, 1])
    log.place("b", "n2", [1])
    log.place("c", "n1", [1])  # voided: GPU 1 is held by a
    log.start("a", "n1")
    log.start("b", "n2")
    log.request_cancel("c")
    log.cancel("c")
    log.lose("n1", after=30)
    log.submit("d", idempotency_key="k-a")  # voided: the key is a's
    log.recover("n1")
    log.place("a", "n1", [2, 3], attempt=2)
    log.start("a", "n1", attempt=2)
    log.finish("a", "n1", attempt=2, after=60)
    log.finish("b", "n2", "failed", exit_code=1)
    log.charge("a", attempt=1, gpus=2, seconds=29)
    log.charge("a", attempt=2, gpus=2, seconds=60)
    log.charge("a", attempt=2, gpus=2, seconds=60)  # voided: charged twice
    log.register("n2", 3, "H100-80GB")
    return log


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

"""The audit's work shared among forked processes: how the points are cut into runs, and
the checks of `fork_checks.py`, run in a fresh interpreter (this test session's process
may hold threads other tests left, and the audit never forks such a process)."""

from __future__ import annotations

import gc
import subprocess
import sys
from pathlib import Path

from gpuloom.audit.verify import runs_of_points
from gpuloom.audit.workers import collector_paused

REPO = Path(__file__).resolve().parents[3]


def test_the_fork_checks_pass_in_a_fresh_interpreter() -> None:
    checks = Path(__file__).with_name("fork_checks.py").relative_to(REPO)
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(checks)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-500:]


def test_the_runs_are_contiguous_nonempty_and_about_equal_in_work() -> None:
    """A point's work: its decisions, the decisions of the point before it, and one."""
    by_basis = {p: [None] * n for p, n in [(3, 10), (8, 10), (9, 10), (15, 10), (20, 3)]}
    points = [1, 3, 8, 9, 15, 20]  # 1: a snapshot to prove, no decision
    weight = dict(zip(points, [1, 11, 21, 21, 21, 14], strict=True))
    total = sum(weight.values())
    for workers in range(1, 9):
        runs = runs_of_points(points, by_basis, workers)  # type: ignore[arg-type]
        assert [p for run in runs for p in run] == points
        assert all(runs) and (2 <= len(runs) <= workers or workers == len(runs) == 1)
        for run in runs:  # each end within half a point of its share's: a point over at most
            assert sum(weight[p] for p in run) <= total / workers + max(weight.values())
    # the last cycle has few decisions, but catches up on all that the one before changed
    assert runs_of_points(points, by_basis, 2) == [[1, 3, 8, 9], [15, 20]]  # type: ignore[arg-type]
    assert runs_of_points([], {}, 4) == [[]]


def test_the_paused_collector_moves_what_survived_to_the_oldest_generation() -> None:
    """Nothing is collected inside; after, the survivors are in the oldest generation (no
    young collection will walk them), nothing stays frozen, and the collector is as it
    was; objects frozen by someone else stay frozen."""
    gc.collect()
    kept = []
    with collector_paused():
        assert not gc.isenabled()
        kept = [[number] for number in range(10_000)]
    assert gc.isenabled()
    assert gc.get_freeze_count() == 0
    oldest = {id(item) for item in gc.get_objects(generation=2)}
    assert all(id(item) in oldest for item in kept), "the survivors are in the oldest"
    gc.disable()
    with collector_paused():
        pass
    assert not gc.isenabled()
    gc.enable()
    marker: list[object] = [object()]  # frozen below: it must stay so
    gc.freeze()
    try:
        with collector_paused():
            kept.append([0])
        assert gc.get_freeze_count() > 0
        generations = {id(item) for number in range(3) for item in gc.get_objects(number)}
        assert id(marker) not in generations, "an object frozen before stays frozen"
    finally:
        gc.unfreeze()

"""An audit shared among forked processes reports exactly what one process does: the same
decisions verified, the same mismatches and snapshot checks in the same order; and a
worker that fails fails the audit, with its traceback.

The audit forks only a process that runs no other thread, and a test session's process
may hold threads other tests left behind: `test_audit_workers.py` runs this module in a
fresh interpreter (it is not collected by name), where every check here must fork."""

from __future__ import annotations

import os
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuloom.audit import audit
from gpuloom.audit.verify import CYCLE_EVENTS
from gpuloom.audit.workers import WorkerFailed, can_fork, run_parts
from gpuloom.events import JobPlaced, Recorded

from .test_audit import JOB_SHAPES, POLICIES, run_log, tampered
from .test_audit_snapshots import claim


@pytest.fixture(autouse=True)
def _a_process_that_can_fork() -> None:
    assert can_fork(), "run in a fresh interpreter (test_audit_workers.py), with one thread"


def seen(report: object) -> tuple[object, ...]:
    return (
        report.verified,  # type: ignore[attr-defined]
        report.mismatches,  # type: ignore[attr-defined]
        [(c.seq, c.source, c.outcome, c.detail) for c in report.snapshots],  # type: ignore[attr-defined]
        report.before_start,  # type: ignore[attr-defined]
    )


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    policy=st.sampled_from(POLICIES),
    shapes=st.lists(JOB_SHAPES, min_size=2, max_size=12),
    finish_every=st.integers(0, 3),
    edits=st.lists(st.floats(0.0, 1.0), max_size=3),
    proofs=st.lists(st.floats(0.0, 1.0), max_size=3),
    workers=st.integers(2, 4),
)
def test_an_audit_in_several_processes_reports_what_one_process_does(
    policy: str,
    shapes: list[dict[str, object]],
    finish_every: int,
    edits: list[float],
    proofs: list[float],
    workers: int,
) -> None:
    log = run_log(policy, shapes, finish_every)
    records: list[Recorded] = list(log.records)
    placed = [i for i, r in enumerate(records) if isinstance(r.event, JobPlaced)]
    for at in edits:  # decisions edited anywhere in the log: mismatches in several runs
        if placed:
            index = placed[int(at * (len(placed) - 1))]
            event = records[index].event
            assert isinstance(event, JobPlaced)
            records = tampered(records, index, attempt=event.attempt + 7)
    last = records[-1].seq
    claims = [claim(log, 1 + int(at * (last - 1))) for at in proofs]
    one = audit(records, snapshots=claims)
    shared = audit(records, snapshots=claims, workers=workers)
    assert seen(shared) == seen(one)
    assert one.workers == 1
    bases = {r.event.basis_seq for r in records if isinstance(r.event, CYCLE_EVENTS)}
    points = bases | {c.seq for c in claims}
    assert 1 <= shared.workers <= workers
    assert shared.workers >= min(2, len(points)), "two points or more: two processes or more"


def test_each_part_starts_from_what_this_process_prepared_before_it() -> None:
    prepared: list[int] = []

    def check(part: int) -> tuple[int, int, list[int]]:
        return part, os.getpid(), list(prepared)

    found = run_parts([1, 3, 4], check, prepared.append)
    assert [(part, seen) for part, _, seen in found] == [
        (1, [1]),
        (3, [1, 3]),
        (4, [1, 3, 4]),
    ]
    pids = [pid for _, pid, _ in found]
    assert pids[-1] == os.getpid() and len(set(pids)) == 3, "the last part here, each other forked"


def test_a_worker_that_raises_fails_the_audit_with_its_traceback() -> None:
    def check(part: int) -> int:
        if part == 2:
            raise ValueError("part two is broken")
        return part * 10

    assert run_parts([1, 3, 4], check) == [10, 30, 40]
    with pytest.raises(WorkerFailed, match=r"(?s)part two is broken.*ValueError"):
        run_parts([1, 2, 3], check)


def test_a_worker_that_dies_fails_the_audit() -> None:
    def check(part: int) -> int:
        if part == 1:  # a forked part (the last is this process's own)
            os._exit(3)
        return part

    with pytest.raises(WorkerFailed, match="without a result \\(exit status 3\\)"):
        run_parts([1, 2], check)


def test_when_this_process_fails_first_its_workers_are_stopped() -> None:
    def check(part: int) -> int:
        if part == 3:  # this process's own part
            raise KeyError("the last part")
        threading.Event().wait(3600)  # a worker that would outlive the failure (and the test)
        return part

    with pytest.raises(KeyError):
        run_parts([1, 2, 3], check)
    with pytest.raises(ChildProcessError):
        os.waitpid(-1, os.WNOHANG)  # no child left, not even a zombie


def test_with_another_thread_running_the_audit_stays_in_one_process() -> None:
    log = run_log("bestfit", [{"gpus": 1}, {"gpus": 2}, {"gpus": 1}] * 2, 1)
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        report = audit(log.records, workers=4)
    finally:
        stop.set()
        other.join()
    assert report.ok and report.workers == 1
    assert audit(log.records, workers=4).workers > 1

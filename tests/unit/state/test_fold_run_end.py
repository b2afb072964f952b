"""A run ends when its process ended (`JobFinished.ended_at`), kept within what the log
knows: never before the run started (nor before an interim charge), never after the
report. Accounting charges exactly that run."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from fixtures.checks import check_invariants

from gpuloom.decide.accounting import decide_charges
from gpuloom.events import (
    JobFinished,
    JobPlaced,
    JobStarted,
    PolicyRef,
    ReplicaAssignment,
    SliceRef,
    UsageCharged,
)
from gpuloom.state import ClusterState
from gpuloom.testing.builders import T0, LogBuilder, gpu_uuid

STARTED = T0 + timedelta(seconds=4)  # the JobStarted of `running_job`'s log


def running_job(gpus: int = 2) -> LogBuilder:
    """j1 with `gpus` GPUs on n1, started at STARTED (seq 5)."""
    log = LogBuilder()
    log.register("n1", gpus=4)
    log.run_to_queue("j1", gpus=gpus)
    log.place("j1", "n1", list(range(gpus)))
    log.start("j1", "n1", at=STARTED)
    return log


def finish(log: LogBuilder, ended_at: datetime | None, *, reported: float) -> ClusterState:
    """Report j1's end `reported` seconds after its start; return the folded state."""
    event = JobFinished(
        job_id="j1", attempt=1, node="n1", outcome="succeeded", exit_code=0, ended_at=ended_at
    )
    log.append(event, at=STARTED + timedelta(seconds=reported))
    state = log.state()
    check_invariants(state, len(log))
    assert state.voided == 0, state.recent_voided
    return state


def charged(state: ClusterState) -> UsageCharged:
    [decision] = decide_charges(state)
    assert isinstance(decision.event, UsageCharged)
    return decision.event


@pytest.mark.parametrize(
    ("ended_after", "reported", "run_seconds"),
    [
        (15.0, 33.0, 15.0),  # reported late (agent was down): charged to the real end
        (15.0, 15.0, 15.0),  # reported at once
        (-5.0, 33.0, 0.0),  # ended before it started (skewed clock): nothing
        (40.0, 33.0, 33.0),  # ended after its own report (lying clock): up to the report
        (None, 33.0, 33.0),  # an old agent that does not say: up to the report, as before
    ],
    ids=[
        "a-late-report-is-charged-to-the-real-end",
        "a-prompt-report-is-unchanged",
        "an-end-before-the-start-charges-nothing",
        "an-end-after-the-report-is-cut-at-the-report",
        "no-end-time-means-the-report-time",
    ],
)
def test_the_run_ends_at_the_reported_end_kept_within_start_and_report(
    ended_after: float | None, reported: float, run_seconds: float
) -> None:
    log = running_job(gpus=2)
    ended_at = None if ended_after is None else STARTED + timedelta(seconds=ended_after)

    state = finish(log, ended_at, reported=reported)

    [run] = state.jobs["j1"].runs
    assert run.ended_at == STARTED + timedelta(seconds=run_seconds)
    assert state.jobs["j1"].phase == "succeeded"
    charge = charged(state)
    assert (charge.seconds, charge.gpu_milli_seconds) == (run_seconds, 2 * 1000 * run_seconds)
    log.append(charge)
    assert log.state().usage_by_account == {"research": 2 * 1000 * run_seconds}


def test_an_interim_charge_is_never_taken_back_by_an_earlier_end() -> None:
    log = running_job(gpus=1)
    interim_end = STARTED + timedelta(seconds=20)
    [interim] = decide_charges(log.state(), interim_end, timedelta(seconds=10))
    log.append(interim.event, at=interim_end)

    state = finish(log, STARTED + timedelta(seconds=15), reported=33.0)

    [run] = state.jobs["j1"].runs
    assert run.ended_at == interim_end
    final = charged(state)
    assert final.gpu_milli_seconds == 0
    log.append(final)
    assert log.state().usage_by_account == {"research": 20_000}, "the parts add up to the run"


def test_a_gang_ends_with_its_last_replica_not_its_last_report() -> None:
    log = LogBuilder()
    log.register("n1", gpus=2)
    log.register("n2", gpus=2)
    log.run_to_queue("g1", gpus=1, replicas=2)
    hosts = ("n1", "n2")
    log.append(
        JobPlaced(
            job_id="g1",
            attempt=1,
            node="n1",
            gpu_indexes=[0],
            gpu_uuids=[gpu_uuid("n1", 0)],
            replicas=[
                ReplicaAssignment(
                    host=host,
                    slices=[
                        SliceRef(
                            node=host, index=0, uuid=gpu_uuid(host, 0), milli=1000, memory_mib=0
                        )
                    ],
                )
                for host in hosts
            ],
            basis_seq=log.seq,
            cycle_position=0,
            policy=PolicyRef(name="test", version=1),
        )
    )
    for replica, host in enumerate(hosts):
        log.append(JobStarted(job_id="g1", attempt=1, node=host, replica=replica), at=STARTED)
    # replica 0 ran to 30 s and said so at once; replica 1 ended at 10 s, told at 40 s
    for replica, (host, ended, told) in enumerate([("n1", 30, 30), ("n2", 10, 40)]):
        event = JobFinished(
            job_id="g1",
            attempt=1,
            node=host,
            replica=replica,
            outcome="succeeded",
            exit_code=0,
            ended_at=STARTED + timedelta(seconds=ended),
        )
        log.append(event, at=STARTED + timedelta(seconds=told))

    state = log.state()
    assert state.voided == 0, state.recent_voided
    [run] = state.jobs["g1"].runs
    # Replica 0's own end (30 s) is not kept by the fold, so the gang is charged to the
    # last report, never to the last reported replica's earlier end (10 s).
    assert run.ended_at == STARTED + timedelta(seconds=40)

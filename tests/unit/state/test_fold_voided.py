"""Events that are not valid at their position in the log are voided: counted, explained,
and without any other effect on the state."""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

import pytest
from fixtures.checks import apply_expecting_void, check_invariants

from gpuloom.events import JobEvent, Recorded, make_envelope
from gpuloom.state import apply, fold
from gpuloom.state.model import VOIDED_KEPT
from gpuloom.testing.builders import T0, LogBuilder, make_gpus


def scene() -> LogBuilder:
    """Two ready nodes, a lost one, and a job in every phase.

    n1 (4 x A100): GPUs 0-1 held by `running`, GPU 2 by `placed`, GPU 3 free.
    n2 (2 x H100): both free; `done` ran there and was charged.
    n3 (1 x A100): lost.
    """
    log = LogBuilder()
    log.register("n1", 4, "A100-80GB")
    log.register("n2", 2, "H100-80GB")
    log.register("n3", 1, "A100-80GB")
    log.lose("n3")
    log.run_to_queue("running", gpus=2)
    log.place("running", "n1", [0, 1])
    log.start("running", "n1")
    log.run_to_queue("placed", gpus=1)
    log.place("placed", "n1", [2])
    log.run_to_queue("queued", gpus=1, gpu_model=["A100-80GB"], idempotency_key="key-queued")
    log.submit("submitted")
    log.submit("admitted")
    log.admit("admitted")
    log.run_to_queue("done", gpus=1, gpu_model=["H100-80GB"])
    log.place("done", "n2", [0])
    log.start("done", "n2")
    log.finish("done", "n2")
    log.charge("done")
    log.submit("cancelled")
    log.request_cancel("cancelled")
    log.cancel("cancelled")
    log.run_to_queue("doomed")
    log.request_cancel("doomed")
    return log


def test_the_scene_itself_is_valid() -> None:
    log = scene()
    state = log.state()
    assert state.voided == 0, state.recent_voided
    check_invariants(state, len(log))
    phases = {job_id: job.phase for job_id, job in state.jobs.items()}
    # `done` (charged) and `cancelled` (never ran) ended: only their tombstones stay.
    assert {job_id: ended.phase for job_id, ended in state.tombstones.items()} == {
        "done": "succeeded",
        "cancelled": "cancelled",
    }
    phases.update({job_id: ended.phase for job_id, ended in state.tombstones.items()})
    assert phases == {
        "running": "running",
        "placed": "placed",
        "queued": "queued",
        "submitted": "submitted",
        "admitted": "admitted",
        "done": "succeeded",
        "cancelled": "cancelled",
        "doomed": "queued",
    }


Make = Callable[[LogBuilder], Recorded]

VOID_CASES: list[tuple[str, Make, str]] = [
    # --- placement
    (
        "placing on a GPU already held is voided",
        lambda log: log.place("queued", "n1", [0]),
        "GPU n1/0 is held by job running",
    ),
    (
        "placing a job that is not queued is voided",
        lambda log: log.place("admitted", "n1", [3]),
        "job admitted is admitted, not queued",
    ),
    (
        "placing a job that is already placed is voided",
        lambda log: log.place("placed", "n1", [3], attempt=2),
        "job placed is placed, not queued",
    ),
    (
        "placing with the wrong attempt is voided",
        lambda log: log.place("queued", "n1", [3], attempt=2),
        "attempt 2 but job queued is at 0",
    ),
    (
        "placing on an unknown node is voided",
        lambda log: log.place("queued", "nowhere", [0]),
        "host nowhere is not ready",
    ),
    (
        "placing on a lost node is voided",
        lambda log: log.place("queued", "n3", [0]),
        "host n3 is not ready",
    ),
    (
        "placing on an unknown GPU index is voided",
        lambda log: log.place("queued", "n1", [7]),
        "node n1 has no GPU 7",
    ),
    (
        "placing with an unknown GPU uuid is voided",
        lambda log: log.place("queued", "n1", [3], gpu_uuids=["GPU-bogus"]),
        "node n1 has no GPU 3 (GPU-bogus)",
    ),
    (
        "placing on a GPU model the job does not allow is voided",
        lambda log: log.place("queued", "n2", [0]),
        "GPU n2/0 is a H100-80GB, not ['A100-80GB']",
    ),
    (
        "placing on more GPUs than the job asked for is voided",
        lambda log: log.place("queued", "n1", [2, 3]),
        "2 GPU slices, the job needs 1",
    ),
    (
        "placing on fewer uuids than indexes is voided",
        lambda log: log.place("queued", "n1", [3], gpu_uuids=[]),
        "0 GPU slices, the job needs 1",
    ),
    (
        "placing a job with a cancel request is voided",
        lambda log: log.place("doomed", "n1", [3]),
        "job doomed has a cancel request",
    ),
    # --- agent
    (
        "starting a cancelled job is voided",
        lambda log: log.start("cancelled", "n1"),
        "job cancelled is cancelled, not placed",
    ),
    (
        "starting a running job again is voided",
        lambda log: log.start("running", "n1"),
        "replica 0 of job running already started",
    ),
    (
        "starting an attempt that is not the current one is voided",
        lambda log: log.start("placed", "n1", attempt=2),
        "attempt 2 is not job placed's current attempt 1",
    ),
    (
        "starting on another node than the placement is voided",
        lambda log: log.start("placed", "n2"),
        "replica 0 of job placed is not hosted on n2",
    ),
    (
        "a second JobFinished is voided",
        lambda log: log.finish("done", "n2", "failed"),
        "job done is succeeded, not placed/running",
    ),
    (
        "finishing an attempt that is not the current one is voided",
        lambda log: log.finish("running", "n1", attempt=2),
        "attempt 2 is not job running's current attempt",
    ),
    # --- admission and queue
    (
        "JobAdmitted twice is voided",
        lambda log: log.admit("admitted"),
        "job admitted is admitted, not submitted",
    ),
    (
        "rejecting an admitted job is voided",
        lambda log: log.reject("admitted"),
        "job admitted is admitted, not submitted",
    ),
    (
        "queueing a job that is not admitted is voided",
        lambda log: log.queue("submitted"),
        "job submitted is submitted, not admitted",
    ),
    (
        "an event about an unknown job is voided",
        lambda log: log.admit("ghost"),
        "unknown job ghost",
    ),
    (
        "cancelling a running job is voided",
        lambda log: log.cancel("running"),
        "job running is running, not submitted/admitted/queued/placed",
    ),
    (
        "cancelling a final job is voided",
        lambda log: log.cancel("done"),
        "job done is succeeded",
    ),
    # --- gateway
    (
        "a duplicate JobSubmitted id is voided",
        lambda log: log.submit("queued"),
        "job queued already submitted",
    ),
    (
        "a reused idempotency key is voided",
        lambda log: log.submit("fresh", idempotency_key="key-queued"),
        "idempotency key already used by job queued",
    ),
    (
        "a cancel request on a final job is voided",
        lambda log: log.request_cancel("done"),
        "job done already succeeded",
    ),
    # --- accounting
    (
        "UsageCharged twice is voided",
        lambda log: log.charge("done"),
        "attempt 1 of job done already charged",
    ),
    (
        "UsageCharged before the run ended is voided",
        lambda log: log.charge("running"),
        "attempt 1 of job running has not ended",
    ),
    (
        "UsageCharged of an attempt that never ran is voided",
        lambda log: log.charge("done", attempt=2),
        "job done has no run for attempt 2",
    ),
    # --- inventory
    (
        "NodeLost of a lost node is voided",
        lambda log: log.lose("n3"),
        "node n3 is not ready",
    ),
    (
        "NodeLost of an unknown node is voided",
        lambda log: log.lose("n9"),
        "node n9 is not ready",
    ),
    (
        "NodeRecovered of a ready node is voided",
        lambda log: log.recover("n1"),
        "node n1 is not lost",
    ),
    (
        "re-registering a node without an allocated GPU is voided",
        lambda log: log.register("n1", 2),
        "GPU n1/2 is held by job placed",
    ),
    (
        "re-registering a node with another uuid for an allocated GPU is voided",
        lambda log: log.register("n1", gpu_list=make_gpus("swapped", 4)),
        "GPU n1/0 is held by job running",
    ),
    (
        "registering a node that declares a GPU index twice is voided",
        lambda log: log.register("n4", gpu_list=make_gpus("n4", 1) + make_gpus("n4", 1)),
        "node n4 declares a GPU index twice",
    ),
]


@pytest.mark.parametrize("keep_history", [False, True], ids=["forgetting", "keeping history"])
@pytest.mark.parametrize(
    ("make", "reason"),
    [(make, reason) for _, make, reason in VOID_CASES],
    ids=[sentence for sentence, _, _ in VOID_CASES],
)
def test_invalid_event_is_voided_and_changes_nothing(
    make: Make, reason: str, keep_history: bool
) -> None:
    """Voided the same with or without the jobs that ended: an event about a job the
    state forgot says so in its reason, and changes nothing either."""
    log = scene()
    state = fold(log.records, keep_history=keep_history)
    recorded = make(log)
    event = recorded.event
    if isinstance(event, JobEvent) and event.job_id in state.tombstones:
        phase = state.tombstones[event.job_id].phase
        reason = f"job {event.job_id} already {phase} (ended and forgotten)"
    apply_expecting_void(state, recorded, reason)
    check_invariants(state, len(log), keep_history=keep_history)


class JobTeleported(JobEvent):
    TYPE: ClassVar[str] = "JobTeleported"


def test_an_event_without_a_fold_rule_is_voided() -> None:
    log = scene()
    state = log.state()
    event = JobTeleported(job_id="queued")
    envelope = make_envelope(event, at=T0, by="test", event_id="evt-x")
    apply_expecting_void(
        state, Recorded(seq=log.seq + 1, envelope=envelope, event=event), "no fold rule"
    )


def test_every_voided_event_is_counted_but_only_the_latest_are_kept() -> None:
    log = LogBuilder()
    state = log.state()
    for _ in range(VOIDED_KEPT + 5):
        apply(state, log.admit("ghost"))
    assert state.voided == VOIDED_KEPT + 5
    assert len(state.recent_voided) == VOIDED_KEPT
    assert state.recent_voided[0].seq == 6
    assert state.recent_voided[-1].seq == log.seq

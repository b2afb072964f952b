"""Why is my job pending: reason codes, position, node verdicts, estimated start."""

from __future__ import annotations

from datetime import timedelta

from gpuloom.decide.explain import explain
from gpuloom.events import Dependency, QueuePolicySet
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.policies import BestFit
from gpuloom.testing.builders import LogBuilder


def busy_cluster() -> LogBuilder:
    log = LogBuilder()
    log.register("n1", 2)
    log.register("n2", 2, model="H100-80GB")
    log.run_to_queue("runner", gpus=2, time_limit_s=600)
    log.place("runner", "n1", [0, 1])
    log.start("runner", "n1")
    return log


def test_a_job_that_no_node_has_room_for_waits_on_resources_with_an_estimate() -> None:
    log = busy_cluster()
    log.run_to_queue("big", gpus=2, gpu_model=["A100-80GB"])
    found = explain(log.state(), "big")
    assert found is not None
    assert (found.reason, found.position, found.ahead) == ("Resources", 1, [])
    assert found.nodes == {
        "n1": "busy: its GPUs are in use",
        "n2": "model: no A100-80GB GPU",
    }
    started = log.state().jobs["runner"].started_at
    assert started is not None
    assert found.estimated_start == started + timedelta(seconds=600)


def test_a_job_with_room_behind_others_waits_on_priority() -> None:
    log = busy_cluster()
    log.run_to_queue("first", gpus=1, gpu_model=["H100-80GB"], priority=5)
    log.run_to_queue("second", gpus=1, gpu_model=["H100-80GB"])
    found = explain(log.state(), "second")
    assert found is not None
    assert (found.reason, found.position, found.ahead) == ("Priority", 2, ["first"])
    assert found.nodes["n2"] == "fits"
    assert found.estimated_start is None


def test_dependency_lost_node_and_running_jobs() -> None:
    log = busy_cluster()
    log.run_to_queue("later", gpus=1, depends_on=[Dependency(job="runner")])
    found = explain(log.state(), "later")
    assert found is not None and found.reason == "Dependency"
    assert found.detail == "Dependency: waiting for runner to succeed"
    log.lose("n2")
    log.run_to_queue("h100", gpus=1, gpu_model=["H100-80GB"])
    found = explain(log.state(), "h100")
    assert found is not None and found.nodes["n2"] == "lost: the node does not heartbeat"
    running = explain(log.state(), "runner")
    assert running is not None and (running.state, running.reason) == ("running", None)
    assert explain(log.state(), "nobody") is None


def test_strict_order_says_priority_and_easy_backfill_says_reservation() -> None:
    for backfill, code in (("off", "Priority"), ("easy", "Reservation")):
        log = LogBuilder()
        log.register("n1", 4)
        log.run_to_queue("runner", gpus=2, time_limit_s=600)
        log.place("runner", "n1", [0, 1])
        log.start("runner", "n1")
        log.append(QueuePolicySet(backfill=backfill))  # type: ignore[arg-type]
        log.run_to_queue("wide", gpus=4, priority=5)
        log.run_to_queue("narrow", gpus=1)  # no time limit: it could outlast the reservation
        log.record_decisions(placement_cycle(log.state(), BestFit()))
        state = log.state()
        assert state.reservation is not None and state.reservation.job_id == "wide"
        assert "narrow" in state.queued, "n1's two free GPUs are wide's, in reserve"
        found = explain(state, "narrow")
        assert found is not None and found.reason == code, (backfill, found)
        assert found.ahead == ["wide"] and found.nodes == {"n1": "fits"}


def test_the_brief_reason_agrees_with_the_full_explanation() -> None:
    log = busy_cluster()
    log.run_to_queue("big", gpus=2, gpu_model=["A100-80GB"])
    log.run_to_queue("first", gpus=1, gpu_model=["H100-80GB"], priority=5)
    log.run_to_queue("second", gpus=1, gpu_model=["H100-80GB"])
    log.run_to_queue("later", gpus=1, depends_on=[Dependency(job="runner")])
    state = log.state()
    for job_id in ("big", "first", "second", "later", "runner"):
        full, brief = explain(state, job_id), explain(state, job_id, brief=True)
        assert full is not None and brief is not None
        assert (brief.state, brief.reason) == (full.state, full.reason), job_id
        assert brief.position is None and brief.estimated_start is None
    for backfill, code in (("off", "Priority"), ("easy", "Reservation")):
        log = LogBuilder()
        log.register("n1", 4)
        log.run_to_queue("runner", gpus=2, time_limit_s=600)
        log.place("runner", "n1", [0, 1])
        log.start("runner", "n1")
        log.append(QueuePolicySet(backfill=backfill))  # type: ignore[arg-type]
        log.run_to_queue("wide", gpus=4, priority=5)
        log.run_to_queue("narrow", gpus=1)
        log.record_decisions(placement_cycle(log.state(), BestFit()))
        state = log.state()
        for job_id in ("wide", "narrow"):
            full, brief = explain(state, job_id), explain(state, job_id, brief=True)
            assert full is not None and brief is not None
            assert brief.reason == full.reason, (backfill, job_id)
        assert brief.reason == code


def test_with_no_node_open_to_work_every_queued_job_waits_on_resources() -> None:
    """The placement cycle makes no pass at all then: explain says so, not `Priority`."""
    log = LogBuilder()
    log.register("n1", 2)
    log.run_to_queue("job", gpus=1)
    log.lose("n1")
    for brief in (True, False):
        found = explain(log.state(), "job", brief=brief)
        assert found is not None and found.reason == "Resources", found
        assert found.detail is not None and "none is ready" in found.detail

"""Advance reservations in the scheduling pass (docs/reservations.md): a job outside one
keeps off its GPUs unless it ends before the start; a job of one waits for the start,
then runs on its GPUs only; a maintenance window is `ReqNodeNotAvail`; the pass leaves
the index as it found it, with what it placed taken."""

from __future__ import annotations

from datetime import timedelta

from gpuloom.events import (
    ReservationCreated,
    ReservationSpec,
    ReservationStarted,
    ReservedGpu,
)
from gpuloom.placement import BestFit, placement_cycle
from gpuloom.placement.holdings import scratch
from gpuloom.placement.inputs import pass_inputs, rules_of
from gpuloom.placement.outcomes import Placed, Waiting
from gpuloom.placement.scheduling import schedule
from gpuloom.state import ClusterState
from gpuloom.testing.builders import LogBuilder

HOUR = 3600


def cluster() -> LogBuilder:
    """Two nodes of 2 GPUs: n1 and n2."""
    log = LogBuilder()
    log.register("n1", 2)
    log.register("n2", 2)
    return log


def reserve(
    log: LogBuilder,
    name: str,
    gpus: list[tuple[str, int]],
    *,
    in_s: float = HOUR,
    for_s: float = HOUR,
    users: tuple[str, ...] = ("alice",),
    flags: tuple[str, ...] = (),
) -> None:
    start = log.now + timedelta(seconds=in_s)
    spec = ReservationSpec(
        start=start,
        end=start + timedelta(seconds=for_s),
        gpus=[ReservedGpu(node=n, index=i) for n, i in gpus],
        users=list(users),
        flags=list(flags),  # type: ignore[arg-type]
    )
    log.append(ReservationCreated(name=name, spec=spec))
    assert name in log.state().reservations, log.state().recent_voided[-1:]


def cycle(log: LogBuilder) -> ClusterState:
    log.record_decisions(placement_cycle(log.state(), BestFit()))
    return log.state()


def outcome(state: ClusterState, job_id: str) -> Placed | Waiting:
    """What a pass over `state` says of `job_id`."""
    inputs = pass_inputs(state, BestFit())
    assert inputs is not None
    for found in schedule(inputs, BestFit(), rules_of(state)):
        if isinstance(found, Placed) and found.candidate.job_id == job_id:
            return found
        if isinstance(found, Waiting) and found.job_id == job_id:
            return found
    raise AssertionError(f"the pass says nothing of {job_id}")


def gpus_of(state: ClusterState, job_id: str) -> set[tuple[str, int]]:
    return {(p.node, p.index) for r in state.jobs[job_id].replicas for p in r.slices}


def test_a_job_without_a_time_limit_keeps_off_reserved_gpus() -> None:
    log = cluster()
    reserve(log, "big", [("n1", 0), ("n1", 1)])
    log.run_to_queue("a", gpus=2)
    log.run_to_queue("b", gpus=2)
    state = cycle(log)
    assert state.jobs["a"].phase == "placed" and gpus_of(state, "a") == {("n2", 0), ("n2", 1)}
    assert state.jobs["b"].phase == "queued", "the only free GPUs are reserved"
    found = outcome(state, "b")
    assert isinstance(found, Waiting) and found.code == "Reservation"
    assert "big" in found.detail


def test_a_job_that_ends_before_the_start_backfills_onto_reserved_gpus() -> None:
    log = cluster()
    reserve(log, "big", [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)], in_s=HOUR)
    log.run_to_queue("long", gpus=1, time_limit_s=2 * HOUR)
    log.run_to_queue("short", gpus=1, time_limit_s=HOUR // 2)
    state = cycle(log)
    assert state.jobs["short"].phase == "placed"
    assert state.jobs["long"].phase == "queued", "it would run past the start"


def test_a_job_of_the_reservation_waits_for_its_start_then_runs_on_its_gpus_only() -> None:
    log = cluster()
    reserve(log, "big", [("n2", 1)], in_s=60)
    log.run_to_queue("mine", gpus=1, user="alice", reservation="big")
    state = cycle(log)
    assert state.jobs["mine"].phase == "queued"
    found = outcome(state, "mine")
    assert isinstance(found, Waiting) and found.code == "Reservation"
    assert "to start at" in found.detail
    log.append(ReservationStarted(name="big"), after=61)
    assert log.state().reservations["big"].started
    state = cycle(log)
    assert state.jobs["mine"].phase == "placed"
    assert gpus_of(state, "mine") == {("n2", 1)}, "n1's idle GPUs are not the reservation's"


def test_no_other_job_uses_a_started_reservation_and_the_fold_refuses_one_that_does() -> None:
    log = cluster()
    reserve(log, "big", [("n2", 0), ("n2", 1)], in_s=10)
    log.append(ReservationStarted(name="big"), after=11)
    log.run_to_queue("a", gpus=2, time_limit_s=60)
    state = cycle(log)
    assert gpus_of(state, "a") == {("n1", 0), ("n1", 1)}
    log.run_to_queue("b", gpus=1, time_limit_s=60)
    before = log.state().voided
    log.place("b", "n2", [0])
    state = log.state()
    assert state.voided == before + 1
    assert "held by reservation big" in state.recent_voided[-1].reason


def test_a_maintenance_window_is_req_node_not_avail_and_drains_in_time() -> None:
    log = cluster()
    reserve(log, "fix", [("n1", 0), ("n1", 1), ("n2", 0), ("n2", 1)], in_s=HOUR,
            users=(), flags=("maint",))  # fmt: skip
    log.run_to_queue("forever", gpus=1)
    log.run_to_queue("short", gpus=1, time_limit_s=600)
    state = cycle(log)
    assert state.jobs["short"].phase == "placed", "it ends before the window"
    assert state.jobs["forever"].phase == "queued"
    found = outcome(state, "forever")
    assert isinstance(found, Waiting) and found.code == "ReqNodeNotAvail"
    assert "fix" in found.detail and "maintenance" in found.detail


def test_the_pass_leaves_the_index_as_it_found_it_with_what_it_placed_taken() -> None:
    log = cluster()
    reserve(log, "big", [("n1", 0)], in_s=HOUR)
    log.run_to_queue("a", gpus=1)
    state = log.state()
    inputs = pass_inputs(state, BestFit())
    assert inputs is not None
    before = scratch(inputs.index)
    outcomes = schedule(inputs, BestFit(), rules_of(state))
    [placed] = [o for o in outcomes if isinstance(o, Placed)]
    [piece] = placed.placement.replicas[0].slices
    assert (piece.node, piece.index) != ("n1", 0)
    for name, view in inputs.index.nodes.items():
        for gpu, old in zip(view.gpus, before.nodes[name].gpus, strict=True):
            took = 1000 if (name, gpu.index) == (piece.node, piece.index) else 0
            assert gpu.milli_free == old.milli_free - took, (name, gpu.index)

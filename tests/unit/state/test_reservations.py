"""Advance reservations as the fold keeps them (docs/reservations.md): made, changed and
deleted by operators, started and ended by placement when their time comes; voided, with
the reason, when the name exists, a GPU is unknown, the window overlaps another
reservation on a GPU, or running jobs will still hold its GPUs at its start (unless
`ignore_jobs`); the queue cancels the waiting jobs of a reservation that is gone."""

from __future__ import annotations

import json
from datetime import datetime, timedelta

import pytest
from rich.console import Console

from gpuloom.client.render import job_details
from gpuloom.decide.queueing import decide_queue
from gpuloom.decide.reservations import GpuAsk, choose_gpus, decide_reservation_times
from gpuloom.events import (
    JobCancelled,
    ReservationCreated,
    ReservationDeleted,
    ReservationEnded,
    ReservationSpec,
    ReservationStarted,
    ReservationUpdated,
    ReservedGpu,
)
from gpuloom.events.jobs import TopologyRequest
from gpuloom.state.rules import reservations as reservation_rules
from gpuloom.store.rows import job_row
from gpuloom.testing.builders import LogBuilder

HOUR = timedelta(hours=1)


def spec(
    log: LogBuilder, gpus: list[tuple[str, int]], *, after: timedelta = HOUR, **kw: object
) -> ReservationSpec:
    start = log.now + after
    return ReservationSpec(
        start=start,
        end=start + HOUR,
        gpus=[ReservedGpu(node=n, index=i) for n, i in gpus],
        users=["alice"],
        **kw,  # type: ignore[arg-type]
    )


def cluster() -> LogBuilder:
    log = LogBuilder()
    log.register("n1", 2)
    return log


def last_void(log: LogBuilder) -> str:
    return log.state().recent_voided[-1].reason


def test_a_reservation_is_kept_changed_and_deleted() -> None:
    log = cluster()
    log.append(ReservationCreated(name="r", spec=spec(log, [("n1", 0)])))
    assert log.state().reservations["r"].gpus == (("n1", 0),)
    log.append(ReservationUpdated(name="r", spec=spec(log, [("n1", 0), ("n1", 1)])))
    assert log.state().reservations["r"].gpus == (("n1", 0), ("n1", 1))
    log.append(ReservationDeleted(name="r"))
    assert "r" not in log.state().reservations


def test_a_name_that_exists_an_unknown_gpu_and_an_overlap_are_voided_with_the_reason() -> None:
    log = cluster()
    log.append(ReservationCreated(name="r", spec=spec(log, [("n1", 0)])))
    log.append(ReservationCreated(name="r", spec=spec(log, [("n1", 1)])))
    assert "exists" in last_void(log)
    log.append(ReservationCreated(name="s", spec=spec(log, [("n1", 7)])))
    assert "node n1 has no GPU 7" in last_void(log)
    log.append(ReservationCreated(name="s", spec=spec(log, [("n1", 0)])))
    assert "GPU(s) n1/0 are in reservation r" in last_void(log)
    later = spec(log, [("n1", 0)], after=3 * HOUR)  # after r ends: no overlap
    log.append(ReservationCreated(name="s", spec=later))
    assert set(log.state().reservations) == {"r", "s"}


def test_running_jobs_that_hold_its_gpus_at_the_start_refuse_it_unless_ignore_jobs() -> None:
    log = cluster()
    log.run_to_queue("forever", gpus=1)
    log.place("forever", "n1", [0])
    log.run_to_queue("short", gpus=1, time_limit_s=60)
    log.place("short", "n1", [1])
    log.append(ReservationCreated(name="r", spec=spec(log, [("n1", 0), ("n1", 1)])))
    reason = last_void(log)
    assert "forever" in reason and "short" not in reason, "short ends before the start"
    ignoring = spec(log, [("n1", 0), ("n1", 1)], flags=["ignore_jobs"])
    log.append(ReservationCreated(name="r", spec=ignoring))
    assert "r" in log.state().reservations


def test_placement_starts_and_ends_it_when_the_time_comes_and_not_before() -> None:
    log = cluster()
    log.append(ReservationCreated(name="r", spec=spec(log, [("n1", 0)])))
    booked = log.state().reservations["r"]
    assert decide_reservation_times(log.state(), booked.start - timedelta(seconds=1)) == []
    [start] = decide_reservation_times(log.state(), booked.start)
    assert isinstance(start.event, ReservationStarted)
    log.append(ReservationStarted(name="r"))  # one second later: before the start
    assert "starts at" in last_void(log)
    log.append(ReservationStarted(name="r"), at=booked.start)
    assert log.state().reservations["r"].started
    [end] = decide_reservation_times(log.state(), booked.end)
    assert isinstance(end.event, ReservationEnded)
    log.append(ReservationEnded(name="r"), at=booked.end)
    assert "r" not in log.state().reservations


def test_the_queue_cancels_the_waiting_jobs_of_a_reservation_that_is_gone() -> None:
    log = cluster()
    log.append(ReservationCreated(name="r", spec=spec(log, [("n1", 0)])))
    log.run_to_queue("mine", gpus=1, reservation="r")
    log.run_to_queue("other", gpus=1)
    assert log.state().reservation_waiters == {"r": {"mine"}}
    assert not any(isinstance(d.event, JobCancelled) for d in decide_queue(log.state()))
    log.append(ReservationDeleted(name="r"))
    cancels = [d.event for d in decide_queue(log.state()) if isinstance(d.event, JobCancelled)]
    assert [(c.job_id, c.reason.split(":")[0]) for c in cancels] == [("mine", "ReservationGone")]
    log.record_decisions(decide_queue(log.state()))
    assert "mine" not in log.state().jobs, "cancelled (and, never run, forgotten)"
    assert "mine" in log.state().tombstones
    assert log.state().reservation_waiters == {}


def test_choose_gpus_takes_the_tightest_domain_and_avoids_busy_and_reserved_gpus() -> None:
    log = LogBuilder()
    log.register("a", 4)
    log.register("b", 2)
    log.run_to_queue("busy", gpus=1)
    log.place("busy", "a", [0])
    state = log.state()
    start: datetime = log.now + HOUR
    chosen = choose_gpus(state, GpuAsk(count=2), start, start + HOUR)
    assert chosen == [("a", 1), ("a", 2)] or chosen == [("b", 0), ("b", 1)]
    assert choose_gpus(state, GpuAsk(count=5), start, start + HOUR) != [], "a has 3 free, b 2"
    assert isinstance(choose_gpus(state, GpuAsk(count=6), start, start + HOUR), str)
    assert len(choose_gpus(state, GpuAsk(count=6), start, start + HOUR, ignore_jobs=True)) == 6


def test_a_jobs_row_and_its_details_say_which_reservation_and_topology_it_asked() -> None:
    log = cluster()
    log.append(ReservationCreated(name="r", spec=spec(log, [("n1", 0)])))
    topology = TopologyRequest(level="rack", mode="preferred")
    log.run_to_queue("mine", gpus=1, reservation="r", topology=topology)
    row = job_row(log.state().jobs["mine"], log.state())
    assert row["request"]["reservation"] == "r"
    assert row["request"]["topology"] == {"level": "rack", "mode": "preferred"}
    shown = Console(width=200, record=True)
    as_sent = json.loads(json.dumps({**row, "id": "mine"}, default=datetime.isoformat))
    shown.print(job_details(as_sent))
    lines = [" ".join(line.split()) for line in shown.export_text().splitlines()]
    assert "reservation r" in lines and "topology preferred rack" in lines, lines


def test_the_gpus_all_reservations_hold_together_are_a_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(reservation_rules, "RESERVED_GPUS_MAX", 2)
    log = cluster()
    log.append(ReservationCreated(name="r", spec=spec(log, [("n1", 0)])))
    later = spec(log, [("n1", 0), ("n1", 1)], after=5 * HOUR)  # no overlap: only the budget
    log.append(ReservationCreated(name="s", spec=later))
    assert "at most 2 GPUs together; 1 are held, this one asks 2" in last_void(log)
    log.append(ReservationUpdated(name="r", spec=spec(log, [("n1", 0), ("n1", 1)])))
    assert log.state().reservations["r"].gpus == (("n1", 0), ("n1", 1)), "its own aside"

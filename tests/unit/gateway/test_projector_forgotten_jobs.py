"""The gateway's projector writes the final row of a job the fold forgets at the same
event (`gpuloom.state.retention`): the read model keeps every job, the fold does not."""

from __future__ import annotations

from typing import Any

from gpuloom.bus import Incoming
from gpuloom.events import encode
from gpuloom.events.subjects import subject_for
from gpuloom.runtime.projector import Projector
from gpuloom.store.models import JobRow
from gpuloom.testing.builders import LogBuilder


def rows_after(log: LogBuilder) -> dict[str, dict[str, Any]]:
    """Fold `log` in the projector as if delivered by the bus; the job rows it would write."""
    projector = Projector(bus=None, sessions=None)  # type: ignore[arg-type]
    for record in log.records:
        message = Incoming(
            seq=record.seq,
            subject=subject_for(record.event),
            body=encode(record.envelope),
            headers={},
            pending=0,
        )
        projector.follower.fold(message)
    return {
        item.key: row
        for item in projector._job_items(sorted(projector._dirty_jobs))
        for model, row in item.rows
        if model is JobRow
    }


def test_a_job_charged_and_forgotten_still_gets_its_final_row() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.run_to_queue("j1", gpus=1)
    log.place("j1", "n1", [0])
    log.start("j1", "n1")
    log.finish("j1", "n1", "failed", exit_code=3, after=60)
    log.charge("j1", seconds=60)
    log.submit("j2", gpus=64)
    log.reject("j2", "too big")
    rows = rows_after(log)
    assert (rows["j1"]["state"], rows["j1"]["exit_code"]) == ("failed", 3)
    assert (rows["j2"]["state"], rows["j2"]["reason"]) == ("rejected", "too big")


def test_a_placed_job_cancelled_by_a_lost_node_gets_its_final_row() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.run_to_queue("j1", gpus=1)
    log.place("j1", "n1", [0])
    log.request_cancel("j1")
    log.lose("n1")  # never started: nothing to charge, it leaves the fold here
    rows = rows_after(log)
    assert rows["j1"]["state"] == "cancelled"

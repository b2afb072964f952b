"""Elastic gangs (`JobSpec.min_replicas`): placed at the most replicas that fit between
their minimum and maximum, grown while they run when nothing waits, shrunk (not stopped)
for a preemption, each replica charged for its own interval; the fast scheduler decides
as the reference, and every decision audits."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from gpuloom.audit import audit
from gpuloom.decide.accounting import decide_charges
from gpuloom.events import (
    AccountCreated,
    Decision,
    GpuUnhealthy,
    JobFinished,
    JobGrown,
    JobPlaced,
    JobPreempted,
    JobReserved,
    JobShrunk,
    JobStarted,
    Outcome,
    PolicyRef,
    PriorityClassSet,
    QuotaSet,
    UsageCharged,
)
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.incremental.index_cache import IndexCache
from gpuloom.placement.policies import BestFit
from gpuloom.state import ClusterState
from gpuloom.state.changes import ChangeFeed
from gpuloom.testing.builders import LogBuilder, make_job_spec


class Played:
    """A log with the reference cycle and a kept (fast) one that must agree on every
    decision, and agents that start every replica placed and end those told to stop."""

    def __init__(self) -> None:
        self.log = LogBuilder()
        self.changes = ChangeFeed()
        self.kept = IndexCache(self.changes)
        #: The state the kept cycle reads, folded through the change feed as a service does.
        self.state = ClusterState()
        self._folded = 0

    def cycle(self) -> list[Decision]:
        decisions = placement_cycle(self.log.state(), BestFit())
        for recorded in self.log[self._folded :]:
            self.changes.apply(self.state, recorded)
        self._folded = len(self.log)
        assert placement_cycle(self.state, BestFit(), kept=self.kept) == decisions
        self.log.record_decisions(decisions)
        return decisions

    def start_all(self, job_id: str) -> None:
        """Start each replica of `job_id` not started yet, replica 0 with a rendezvous."""
        state = self.log.state()
        job = state.jobs[job_id]
        for number, replica in enumerate(job.replicas):
            if number in job.started_replicas or number in job.finished_replicas:
                continue
            master = {"master_addr": "10.0.0.1", "master_port": 29500} if number == 0 else {}
            self.log.append(
                JobStarted(
                    job_id=job_id, attempt=job.attempt, node=replica.host, replica=number, **master
                )
            )

    def stop_leaving(self, job_id: str) -> None:
        """The agents stop the replicas a shrink told to leave."""
        job = self.log.state().jobs[job_id]
        for number in sorted(job.leaving):
            self.log.append(
                JobFinished(
                    job_id=job_id,
                    attempt=job.attempt,
                    node=job.replicas[number].host,
                    replica=number,
                    outcome="preempted",
                    exit_code=143,
                ),
                after=0.5,
            )


def elastic_on_two_nodes() -> Played:
    """Two nodes of 2 GPUs; `small` holds one; `el` asks 1 GPU per replica, 2 to 4."""
    played = Played()
    log = played.log
    log.append(PriorityClassSet(name="urgent", priority=100))
    log.register("n1", 2)
    log.register("n2", 2)
    log.run_to_queue("small", gpus=1, time_limit_s=600)
    played.cycle()
    log.start("small", "n1")
    log.run_to_queue("el", gpus=1, replicas=4, min_replicas=2, preemptible=True)
    return played


def test_an_elastic_gang_starts_with_as_many_replicas_as_fit() -> None:
    played = elastic_on_two_nodes()
    [decision] = played.cycle()
    event = decision.event
    assert isinstance(event, JobPlaced)
    assert len(event.replicas) == 3, "3 GPUs are free: between its minimum 2 and maximum 4"
    job = played.log.state().jobs["el"]
    assert job.phase == "placed" and len(job.live_replicas()) == 3


def test_it_starts_at_its_minimum_and_no_more_while_a_job_ahead_waits() -> None:
    played = Played()
    log = played.log
    log.register("n1", 4)
    log.run_to_queue("holder", gpus=2)
    log.place("holder", "n1", [0, 1])
    log.start("holder", "n1")
    log.run_to_queue("big", gpus=3, time_limit_s=600)  # blocked: 2 free
    log.run_to_queue("el", gpus=1, replicas=3, min_replicas=1, time_limit_s=60)
    decisions = played.cycle()
    placed = [d.event for d in decisions if isinstance(d.event, JobPlaced)]
    assert [(e.job_id, len(e.replicas)) for e in placed] == [("el", 1)], (
        "it backfills at its minimum; what it would take beyond is the blocked job's"
    )


def test_it_grows_when_gpus_free_up_and_nothing_waits() -> None:
    played = elastic_on_two_nodes()
    played.cycle()
    played.start_all("el")
    assert played.cycle() == [], "no GPU is free"
    played.log.finish("small", "n1", after=10)
    [decision] = played.cycle()
    grown = decision.event
    assert isinstance(grown, JobGrown)
    assert (grown.first, len(grown.replicas), grown.attempt) == (3, 1, 1)
    played.start_all("el")
    job = played.log.state().jobs["el"]
    assert job.live_replicas() == [0, 1, 2, 3] and job.phase == "running"
    assert played.cycle() == [], "at its maximum"


def test_it_does_not_grow_while_a_job_waits_for_resources() -> None:
    played = elastic_on_two_nodes()
    played.cycle()
    played.start_all("el")
    played.log.run_to_queue("wide", gpus=2, replicas=2)  # needs all 4 GPUs
    played.log.finish("small", "n1", after=10)
    decisions = played.cycle()
    assert not any(isinstance(d.event, JobGrown) for d in decisions)


def test_a_preemption_shrinks_it_to_its_minimum_instead_of_stopping_it() -> None:
    played = elastic_on_two_nodes()
    log = played.log
    played.cycle()
    played.start_all("el")
    log.finish("small", "n1", after=10)
    played.cycle()  # grows to 4
    played.start_all("el")
    log.run_to_queue("urgent", gpus=2, priority=100, priority_class="urgent", after=5)
    decisions = [d for d in played.cycle() if not isinstance(d.event, JobReserved)]
    assert [type(d.event) for d in decisions] == [JobShrunk]
    shrunk = decisions[0].event
    assert isinstance(shrunk, JobShrunk)
    assert (shrunk.by, shrunk.reason, len(shrunk.replicas)) == ("urgent", "priority", 2)
    assert 0 not in shrunk.replicas, "replica 0 holds the rendezvous"
    again = [d for d in played.cycle() if not isinstance(d.event, JobReserved)]
    assert again == [], "urgent waits for the replicas to leave; nothing else stops"
    played.stop_leaving("el")
    state = log.state()
    job = state.jobs["el"]
    assert job.phase == "running" and len(job.live_replicas()) == 2
    assert job.left == set(shrunk.replicas) and job.shrink_by is None
    [placed] = played.cycle()
    assert isinstance(placed.event, JobPlaced) and placed.event.job_id == "urgent"


def test_below_its_minimum_it_is_preempted_whole() -> None:
    played = Played()
    log = played.log
    log.append(PriorityClassSet(name="urgent", priority=100))
    log.register("n1", 2)
    log.run_to_queue("el", gpus=1, replicas=2, min_replicas=2, preemptible=True)
    played.cycle()
    played.start_all("el")
    log.run_to_queue("urgent", gpus=1, priority=100, priority_class="urgent")
    [decision] = [d for d in played.cycle() if not isinstance(d.event, JobReserved)]
    assert isinstance(decision.event, JobPreempted) and decision.event.job_id == "el"


def test_each_replica_is_charged_for_its_own_interval() -> None:
    played = elastic_on_two_nodes()
    log = played.log
    played.cycle()
    played.start_all("el")  # 3 replicas from here
    started = log.state().jobs["el"].runs[-1].started_at
    log.finish("small", "n1", after=100)
    played.cycle()  # the 4th replica joins
    grown_at = log.state().clock
    played.start_all("el")
    log.run_to_queue("urgent", gpus=2, priority=100, priority_class="urgent", after=50)
    played.cycle()
    played.stop_leaving("el")  # 2 leave
    state = log.state()
    left_at = state.clock
    job = state.jobs["el"]
    assert len(job.live_replicas()) == 2
    for number in job.live_replicas():
        log.append(
            JobFinished(
                job_id="el", attempt=1, node=job.replicas[number].host, replica=number,
                outcome="succeeded", exit_code=0,
            ),
            after=200,
        )  # fmt: skip
    state = log.state()
    run = state.jobs["el"].runs[-1]
    assert state.jobs["el"].phase == "succeeded", "the replicas that left do not count"
    assert started is not None and grown_at is not None and left_at is not None
    assert run.ended_at is not None

    def seconds(a: datetime, b: datetime) -> float:
        return (b - a).total_seconds()

    # the two leaving replicas ended half a second apart: the first left before the second
    first_left = left_at - timedelta(seconds=0.5)
    expected = (
        3000 * seconds(started, grown_at)
        + 4000 * seconds(grown_at, first_left)
        + 3000 * seconds(first_left, left_at)
        + 2000 * seconds(left_at, run.ended_at)
    )
    assert run.gpu_milli_seconds() == pytest.approx(expected, abs=3)
    [charge] = [
        d.event
        for d in decide_charges(state)
        if isinstance(d.event, UsageCharged) and d.event.job_id == "el"
    ]
    assert charge.gpu_milli_seconds == run.gpu_milli_seconds()
    assert sum(charge.by_model.values()) == pytest.approx(charge.gpu_milli_seconds, abs=3)


def test_every_decision_audits() -> None:
    played = elastic_on_two_nodes()
    log = played.log
    played.cycle()
    played.start_all("el")
    log.finish("small", "n1", after=10)
    played.cycle()
    played.start_all("el")
    log.run_to_queue("urgent", gpus=2, priority=100, priority_class="urgent", after=5)
    played.cycle()
    report = audit(list(log))
    assert report.ok, report.mismatches
    assert report.verified == 5, "small and el placed, el grown and shrunk, urgent reserved"


def test_the_fold_refuses_growth_past_the_maximum_and_shrinking_below_the_minimum() -> None:
    played = elastic_on_two_nodes()
    log = played.log
    [placed] = played.cycle()
    played.start_all("el")
    event = placed.event
    assert isinstance(event, JobPlaced)
    too_many = JobGrown(
        job_id="el", attempt=1, first=3, replicas=event.replicas[:2],
        basis_seq=log.seq, cycle_position=0, policy=event.policy,
    )  # fmt: skip
    log.append(too_many)
    assert "4 replicas, job el may have" not in voided(log), "3 + 2 is 5"
    assert "5 replicas, job el may have 4" in voided(log)
    too_few = JobShrunk(
        job_id="el", attempt=1, replicas=[1, 2], by="small", reason="priority",
        basis_seq=log.seq, cycle_position=0, policy=event.policy,
    )  # fmt: skip
    log.append(too_few)
    assert "under its minimum of 2" in voided(log)


def voided(log: LogBuilder) -> str:
    """Why the log's last event was voided ("" if it was applied)."""
    state = log.state()
    last = state.recent_voided[-1] if state.recent_voided else None
    return last.reason if last is not None and last.seq == log.seq else ""


def test_a_minimum_over_the_maximum_is_refused_naming_the_field() -> None:
    with pytest.raises(ValidationError, match=r"replicas\.min \(3\) must be at most replicas\.max"):
        make_job_spec(replicas=2, min_replicas=3)


def test_a_gang_one_of_whose_replicas_ended_does_not_grow() -> None:
    played = elastic_on_two_nodes()
    log = played.log
    played.cycle()
    played.start_all("el")
    job = log.state().jobs["el"]
    log.append(
        JobFinished(
            job_id="el", attempt=1, node=job.replicas[2].host, replica=2,
            outcome="succeeded", exit_code=0,
        )
    )  # fmt: skip
    log.finish("small", "n1", after=10)
    assert played.cycle() == [], "its training is ending: it takes no more GPUs"


def four_running(played: Played) -> None:
    """`el` (1 to 4 replicas of 1 GPU) runs 4 replicas on two nodes of 2 GPUs."""
    log = played.log
    log.register("n1", 2)
    log.register("n2", 2)
    log.run_to_queue("el", gpus=1, replicas=4, min_replicas=1, preemptible=True)
    played.cycle()
    played.start_all("el")
    log.run_to_queue("x", gpus=1)


def shrink(log: LogBuilder, replicas: list[int], after: float) -> None:
    policy = PolicyRef(name="bestfit", version=2)
    log.append(
        JobShrunk(
            job_id="el", attempt=1, replicas=replicas, by="x", reason="priority",
            basis_seq=log.seq, cycle_position=0, policy=policy,
        ),
        after=after,
    )  # fmt: skip


def end(log: LogBuilder, number: int, **when: Any) -> None:
    job = log.state().jobs["el"]
    outcome: Outcome = "preempted" if number in job.leaving or job.health_stop else "succeeded"
    log.append(
        JobFinished(
            job_id="el", attempt=1, node=job.replicas[number].host, replica=number,
            outcome=outcome, exit_code=0,
        ),
        **when,
    )  # fmt: skip


def test_a_replica_leaving_after_a_gpu_failed_is_charged_to_the_fault_as_the_rest() -> None:
    played = Played()
    log = played.log
    four_running(played)
    started = log.state().jobs["el"].runs[-1].started_at
    shrink(log, [3], after=10)
    piece = log.state().jobs["el"].replicas[0].slices[0]
    fault = GpuUnhealthy(node=piece.node, index=piece.index, uuid=piece.uuid, check="xid")
    at_fault = log.append(fault, after=100).envelope.at
    end(log, 3, after=1000)  # its report comes long after the fault
    for number in (0, 1, 2):
        end(log, number, after=1)
    run = log.state().jobs["el"].runs[-1]
    assert run.ended_at == at_fault
    assert run.gpu_milli_seconds() == round(4000 * (at_fault - started).total_seconds())


def test_charges_add_up_when_a_leaving_replicas_report_is_stamped_before_an_interim_charge() -> (
    None
):
    played = Played()
    log = played.log
    four_running(played)
    shrink(log, [1, 2, 3], after=1)
    started = log.state().jobs["el"].runs[-1].started_at
    interim = decide_charges(
        log.state(), now=started + timedelta(seconds=1000), interval=timedelta(seconds=60)
    )
    log.record_decisions(interim)
    for number in (1, 2, 3):  # stamped by a clock behind: before the interim charge's end
        end(log, number, at=started + timedelta(seconds=500))
    end(log, 0, at=started + timedelta(seconds=2000))
    state = log.state()
    run = state.jobs["el"].runs[-1]
    final = [d.event for d in decide_charges(state) if isinstance(d.event, UsageCharged)]
    charged = sum(e.gpu_milli_seconds for e in [*[d.event for d in interim], *final])  # type: ignore[attr-defined]
    assert charged == run.gpu_milli_seconds() == 4000 * 1000 + 1000 * 1000, (
        "charged 4 GPUs to the interim charge's end (never taken back), 1 after"
    )


def test_growth_keeps_to_the_models_its_quotas_admit() -> None:
    """`team` may hold one H100 (`model:H100-80GB` quota, no cohort to borrow from): its
    gang, running on that H100, grows on the A100s, which best-fit would try after it."""
    played = Played()
    log = played.log
    log.register("a", 2, "A100-80GB")
    log.register("h", 2, "H100-80GB")
    log.append(AccountCreated(account="team"))
    log.append(QuotaSet(account="team", resource="model:H100-80GB", nominal=1000))
    log.run_to_queue("blocker", gpus=2, gpu_model=["A100-80GB"])
    log.run_to_queue("el", gpus=1, replicas=3, min_replicas=1, account="team")
    placed = {d.event.job_id: d.event for d in played.cycle()}
    assert set(placed) == {"blocker", "el"}
    el = placed["el"]
    assert isinstance(el, JobPlaced) and [r.host for r in el.replicas] == ["h"], (
        "the A100s are taken; one H100 is all its quota admits"
    )
    log.start("blocker", "a")
    played.start_all("el")
    log.finish("blocker", "a", after=10)
    [grown] = [d.event for d in played.cycle() if isinstance(d.event, JobGrown)]
    assert [r.host for r in grown.replicas] == ["a", "a"]

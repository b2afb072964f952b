"""One user's jobs placed and not started yet are at most `unstarted_per_node` times the
schedulable nodes (`QueuePolicySet`): the agents start each user's jobs at a paced rate,
and jobs placed beyond that would hold GPUs idle that another user's job could run on.
Logs without the field place as they did."""

from __future__ import annotations

from gpuloom.audit import audit
from gpuloom.config import Settings
from gpuloom.decide.explain import explain
from gpuloom.events import JobPlaced, NodeCordoned, QueuePolicySet
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.policies import BestFit
from gpuloom.testing.builders import LogBuilder
from services.queue.__main__ import configured_policy


def burst_then_alice(per_node: int | None, nodes: int = 2) -> LogBuilder:
    """`nodes` nodes of 8 GPUs; mallory queues 10 one-GPU jobs, then alice queues one."""
    log = LogBuilder()
    log.append(QueuePolicySet(victims_yield=True, fair_queuing=True, unstarted_per_node=per_node))
    for number in range(nodes):
        log.register(f"n{number}", 8)
    for number in range(10):
        log.run_to_queue(f"m{number}", gpus=1, user="mallory", account="lab")
    log.run_to_queue("alice-1", gpus=1, user="alice", account="research")
    return log


def placed_by_one_cycle(log: LogBuilder) -> dict[str, str]:
    """The jobs one cycle places, with their node; the decisions are appended."""
    decisions = placement_cycle(log.state(), BestFit())
    for decision in decisions:
        log.append(decision.event)
    return {d.event.job_id: d.event.node for d in decisions if isinstance(d.event, JobPlaced)}


def test_a_user_has_at_most_so_many_jobs_waiting_to_start_and_others_still_place() -> None:
    log = burst_then_alice(per_node=2)
    placed = placed_by_one_cycle(log)
    mallory = sorted(job for job in placed if job.startswith("m"))
    assert len(mallory) == 4, "2 per node, 2 nodes"
    assert "alice-1" in placed, "another user's job is not held by mallory's limit"
    assert placed_by_one_cycle(log) == {}, "nothing more until one starts"
    log.start(mallory[0], placed[mallory[0]])
    assert len(placed_by_one_cycle(log)) == 1, "one started: one more may wait"
    report = audit(log.records)
    assert report.ok and report.verified == 6, report.mismatches


def test_without_the_limit_every_job_that_fits_is_placed() -> None:
    log = burst_then_alice(per_node=None)
    assert len(placed_by_one_cycle(log)) == 11


def test_the_limit_follows_the_schedulable_nodes() -> None:
    log = burst_then_alice(per_node=3, nodes=3)
    log.append(NodeCordoned(node="n2", reason="maintenance"))
    mallory = [job for job in placed_by_one_cycle(log) if job.startswith("m")]
    assert len(mallory) == 6, "3 per node, 2 nodes schedulable"


def test_explain_says_the_job_waits_for_the_users_jobs_to_start() -> None:
    log = burst_then_alice(per_node=1)
    placed_by_one_cycle(log)
    why = explain(log.state(), "m5")
    assert why is not None and why.reason == "StartPacing", why
    assert "2 of user mallory's jobs are placed and not started yet" in (why.detail or "")
    assert "the most is 2 (1 per node)" in (why.detail or "")


def test_the_queue_service_records_the_configured_limit() -> None:
    assert configured_policy(Settings()).unstarted_per_node == 4
    assert configured_policy(Settings(queue_unstarted_per_node=0)).unstarted_per_node is None

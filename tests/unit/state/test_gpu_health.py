"""GPU health in the fold (issue #40): a failed GPU leaves placement until an operator
resumes it; a job on it is stopped by its agent, charged up to the fault and requeued
first among its priority (expedited requeue)."""

from __future__ import annotations

from gpuloom.audit import audit
from gpuloom.decide.explain import explain
from gpuloom.events import GpuHealthy, GpuUnhealthy, JobPlaced, NodeRegistered
from gpuloom.placement.cycle import placement_cycle
from gpuloom.placement.policies import BestFit
from gpuloom.queueing.order import queue_order
from gpuloom.testing.builders import LogBuilder
from services.agent.reconcile import Local, Report, Status, Stop, reconcile


def uuid_of(log: LogBuilder, node: str, index: int) -> str:
    return log.state().nodes[node].gpus[index].uuid


def failing(log: LogBuilder, node: str, index: int, **kw: object) -> GpuUnhealthy:
    return GpuUnhealthy(
        node=node, index=index, uuid=uuid_of(log, node, index), check="xid",
        evidence="Xid 79: GPU has fallen off the bus", **kw,
    )  # fmt: skip


def placed_by_one_cycle(log: LogBuilder) -> dict[str, tuple[int, ...]]:
    decisions = placement_cycle(log.state(), BestFit())
    for decision in decisions:
        log.append(decision.event)
    return {
        d.event.job_id: tuple(d.event.gpu_indexes)
        for d in decisions
        if isinstance(d.event, JobPlaced)
    }


def running_on_gpu_0() -> LogBuilder:
    """Node n1 of 2 GPUs; job `a` runs on GPU 0 since T0 + 1 s."""
    log = LogBuilder()
    log.register("n1", 2)
    log.run_to_queue("a", gpus=1)
    assert placed_by_one_cycle(log) == {"a": (0,)}
    log.start("a", "n1", after=1)
    return log


def test_a_job_on_a_failed_gpu_is_stopped_charged_to_the_fault_and_requeued_first() -> None:
    log = running_on_gpu_0()
    fault = log.append(failing(log, "n1", 0), after=10)
    job = log.state().jobs["a"]
    assert job.health_stop == "GPU n1/0 failed (xid: Xid 79: GPU has fallen off the bus)"
    assert job.reason is not None and "stopping, then requeued first" in job.reason
    actions = reconcile(log.state(), ["n1"], {("a", 1, 0): Local("n1", 4242, Status.RUNNING)})
    assert actions == [Stop(("a", 1, 0), "preempted", job.health_stop, checkpoint=True)]
    log.finish("a", "n1", "preempted", after=30)  # its agent stopped it 30 s later
    job = log.state().jobs["a"]
    assert (job.phase, job.requeues, job.expedited) == ("queued", 1, True)
    assert job.reason == "requeued first: GPU n1/0 failed (xid: Xid 79: GPU has fallen off the bus)"
    assert job.runs[-1].ended_at == fault.envelope.at, "charged up to the fault, not the stop"
    assert job.runs[-1].seconds == 10
    assert placed_by_one_cycle(log) == {"a": (1,)}, "placed again, never on the failed GPU"
    assert not log.state().jobs["a"].expedited
    report = audit(log.records)
    assert report.ok, report.mismatches


def test_a_job_placed_on_it_and_not_started_is_reported_before_start() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.run_to_queue("a", gpus=1)
    placed_by_one_cycle(log)
    log.append(failing(log, "n1", 0))
    [action] = reconcile(log.state(), ["n1"], {})
    assert isinstance(action, Report)
    assert action.decision.event.outcome == "preempted"  # type: ignore[union-attr]


def test_placement_leaves_a_failed_gpu_until_an_operator_resumes_it() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.append(failing(log, "n1", 0))
    log.run_to_queue("a", gpus=2)
    log.run_to_queue("b", gpus=1)
    assert placed_by_one_cycle(log) == {"b": (1,)}, "a needs both: it waits"
    found = explain(log.state(), "a")
    assert found is not None and found.nodes["n1"] == (
        "busy: its GPUs are in use or out of service"
        " (GPU 0 failed (xid: Xid 79: GPU has fallen off the bus))"
    ), "explain names the failed GPU"
    log.append(GpuHealthy(node="n1", index=0, reason="reseated"))
    assert log.state().nodes["n1"].unhealthy == {}
    log.finish("b", "n1", "succeeded")  # placed, never started: its GPU comes back
    assert placed_by_one_cycle(log) == {"a": (0, 1)}


def test_a_requeued_job_goes_first_among_its_priority() -> None:
    log = LogBuilder()
    log.register("n1", 1)
    log.run_to_queue("a", gpus=1)
    placed_by_one_cycle(log)
    log.start("a", "n1")
    for name in ("b", "c"):
        log.run_to_queue(name, gpus=1)
    log.run_to_queue("high", gpus=1, priority=5)
    log.append(failing(log, "n1", 0))
    log.finish("a", "n1", "preempted")
    assert [job.job_id for job in queue_order(log.state())] == ["high", "a", "b", "c"]


def test_what_is_not_a_fault_where_it_lands_is_voided() -> None:
    log = LogBuilder()
    log.register("n1", 1)
    state = log.state()
    bad = [
        GpuUnhealthy(node="n9", index=0, uuid="GPU-x", check="xid"),
        GpuUnhealthy(node="n1", index=3, uuid="GPU-x", check="xid"),
        GpuUnhealthy(node="n1", index=0, uuid="GPU-other", check="xid"),
        GpuHealthy(node="n1", index=0),
    ]
    for event in bad:
        log.append(event)
    state = log.state()
    assert state.voided == len(bad)
    assert [v.reason for v in state.recent_voided][-4:] == [
        "unknown node n9",
        "node n1 has no GPU 3",
        f"GPU n1/0 is {uuid_of(log, 'n1', 0)}, not GPU-other",
        "GPU n1/0 is in service",
    ]
    log.append(failing(log, "n1", 0))
    log.append(failing(log, "n1", 0))
    assert log.state().recent_voided[-1].reason == "GPU n1/0 is already out of service"


def test_the_same_gpu_stays_out_when_its_node_registers_again_and_a_new_one_is_in() -> None:
    log = LogBuilder()
    log.register("n1", 2)
    log.append(failing(log, "n1", 0))
    spec = log.state().nodes["n1"].spec
    log.append(NodeRegistered(node="n1", spec=spec.model_copy(update={"labels": {"z": "a"}})))
    assert set(log.state().nodes["n1"].unhealthy) == {0}
    swapped = [g.model_copy(update={"uuid": "GPU-new"}) if g.index == 0 else g for g in spec.gpus]
    log.append(NodeRegistered(node="n1", spec=spec.model_copy(update={"gpus": swapped})))
    assert log.state().nodes["n1"].unhealthy == {}, "a replaced GPU is another GPU"

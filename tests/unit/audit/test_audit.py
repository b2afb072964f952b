"""Audit and replay on generated logs: every decision is re-made, a tampered one is caught."""

from __future__ import annotations

import gc

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuloom.audit import audit, snapshot, state_at
from gpuloom.events import (
    GpuPoolChanged,
    GpuSpec,
    JobFinished,
    JobPlaced,
    JobReserved,
    JobStarted,
    NodeRegistered,
    NodeSpec,
    Recorded,
)
from gpuloom.placement import default_registry, placement_cycle
from gpuloom.testing.builders import LogBuilder, make_job_spec

POLICIES = ["bestfit", "spread", "dotprod", "pack", "random", "fgd", "loom"]


def node(
    name: str, count: int, model: str, pool: str, lends: bool = False, cpu_milli: int = 64_000
) -> NodeRegistered:
    gpus = [
        GpuSpec(index=i, uuid=f"{name}-{i}", model=model, memory_mib=40_960, pool=pool)  # type: ignore[arg-type]
        for i in range(count)
    ]
    spec = NodeSpec(gpus=gpus, cpu_milli=cpu_milli, memory_mib=256_000, lends_remote_vgpu=lends)
    return NodeRegistered(node=name, spec=spec)


SHAPES = [
    {"gpus": 1},
    {"gpus": 2},
    {"gpus": 4, "cpu_milli": 8000},
    {"gpus": 1, "gpu_milli": 250},
    {"gpus": 1, "gpu_milli": 500, "gpu_model": ["T4"]},
    {"gpus": 2, "gpu_milli": 300, "locality": "local-first"},
    {"gpus": 1, "pool": "physical", "gpu_model": ["A100"]},
    {"gpus": 0, "cpu_milli": 2000},
]
JOB_SHAPES = st.sampled_from(SHAPES)


def run_log(
    policy_name: str,
    shapes: list[dict[str, object]],
    finish_every: int,
    pool_moves: list[tuple[str, int]] = (),  # type: ignore[assignment]
    version: int | None = None,
    cpu_of_c: int = 64_000,
) -> LogBuilder:
    """A log as the services would write it: submit, admit, queue, placement cycles, runs,
    and an admin moving GPUs between pools (`pool_moves`, one per job, while they last);
    decided by `policy_name`'s current version, or its earlier `version`; node "c" has
    `cpu_of_c` CPU milli, "a" and "b" 64,000."""
    policy = default_registry().get(policy_name, version)
    log = LogBuilder()
    log.append(node("a", 4, "A100", "physical"))
    log.append(node("b", 2, "T4", "vgpu", lends=True))
    log.append(node("c", 2, "A100", "vgpu", cpu_milli=cpu_of_c))
    running: list[tuple[str, str]] = []
    for number, fields in enumerate(shapes):
        job_id = f"j{number}"
        extra = {k: v for k, v in fields.items() if k not in ("gpus", "gpu_model")}
        spec = make_job_spec(
            int(fields["gpus"]),  # type: ignore[call-overload]
            gpu_model=list(fields.get("gpu_model", [])),  # type: ignore[call-overload]
            **extra,
        )
        log.submit(job_id, spec)
        log.admit(job_id)
        log.queue(job_id, priority=number % 3)
        if number < len(pool_moves):
            name, index = pool_moves[number]
            gpu = log.state().nodes[name].gpus[index]
            other = "vgpu" if gpu.pool == "physical" else "physical"
            log.append(GpuPoolChanged(node=name, index=index, pool=other))
        for decision in placement_cycle(log.state(), policy):
            [placed] = log.record_decisions([decision])
            event = placed.event
            if not isinstance(event, JobPlaced):
                assert isinstance(event, JobReserved)  # the blocked head of the queue
                continue
            log.append(JobStarted(job_id=event.job_id, attempt=event.attempt, node=event.node))
            running.append((event.job_id, event.node))
        if finish_every and number % finish_every == 0 and running:
            job, where = running.pop(0)
            attempt = log.state().jobs[job].attempt
            log.append(JobFinished(job_id=job, attempt=attempt, node=where, outcome="succeeded"))
    return log


#: What `run_log` is given, drawn (here and in test_kept_views.py).
RUN_LOG_ARGUMENTS = {
    "policy": st.sampled_from(POLICIES),
    "shapes": st.lists(JOB_SHAPES, min_size=1, max_size=14),
    "finish_every": st.integers(0, 3),
    "pool_moves": st.lists(
        st.tuples(st.sampled_from(["a", "b", "c"]), st.integers(0, 1)), max_size=6
    ),
}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(**RUN_LOG_ARGUMENTS)
def test_audit_reproduces_every_decision_of_a_generated_log(
    policy: str,
    shapes: list[dict[str, object]],
    finish_every: int,
    pool_moves: list[tuple[str, int]],
) -> None:
    log = run_log(policy, shapes, finish_every, pool_moves)
    state = log.state()
    # only an admin's move of a GPU in use is refused; placement never proposes a bad decision
    assert all(v.type == "GpuPoolChanged" and "in use" in v.reason for v in state.recent_voided)
    assert state == log.state(), "folding the same log twice gives equal states"
    for name, node in state.nodes.items():
        for gpu in node.gpus.values():
            assert gpu.milli_used <= 1000 and gpu.memory_used <= gpu.memory_mib, (name, gpu)
            assert gpu.pool == "vgpu" or len(gpu.holders) <= 1
            if gpu.milli_used < 1000 and gpu.holders:
                assert gpu.pool == "vgpu", "fractions only on the vGPU pool"
    decisions = sum(1 for r in log.records if isinstance(r.event, (JobPlaced, JobReserved)))
    report = audit(log.records)
    assert report.ok, report.mismatches
    assert report.verified == decisions


@pytest.mark.parametrize("policy", ["bestfit", "fgd", "loom"])
def test_the_audit_makes_no_garbage_cycles(policy: str) -> None:
    """The audit re-makes decisions with the cycle collector paused
    (`gpuloom.audit.workers.collector_paused`): all it drops must be freed by reference
    counting alone, or a long audit would hold it until the end. (The collector stays off
    here until the audit's garbage is counted, and the audit leaves it as it found it.)"""
    log = run_log(policy, SHAPES * 3, finish_every=2, pool_moves=[("a", 0), ("b", 1)])
    gc.collect()
    gc.disable()
    try:
        report = audit(log.records, workers=1)
        assert not gc.isenabled()
        assert gc.collect() == 0, "the audit left garbage cycles"
    finally:
        gc.enable()
    assert report.ok and report.verified > 0, report.mismatches
    audit(log.records, workers=1)
    assert gc.isenabled()


def test_the_audit_re_makes_the_decisions_of_every_version() -> None:
    """fgd and loom v2 read the typical workload every 100 submissions, loom v3 leaves
    used nodes of scarce models to the tasks bound to them, loom v4 values the gaps
    shares leave, loom v5 counts what a node's CPU will strand; logs written by earlier
    versions are still re-made by those versions, kept for them."""
    registry = default_registry()
    assert registry.get("fgd").version == 2 and registry.get("loom").version == 5
    assert registry.get("fgd", 1).workload_every == 1
    assert registry.get("fgd", 9) is registry.get("fgd")  # unknown: the caller says what differs
    shapes: list[dict[str, object]] = [
        {"gpus": 1, "gpu_milli": 250},
        {"gpus": 1, "cpu_milli": 2000},
        {"gpus": 2},
        {"gpus": 1, "gpu_milli": 500, "gpu_model": ["T4"]},
    ] * 5
    for name, versions in (("fgd", (1, 2)), ("loom", (1, 2, 3, 4, 5))):
        for version in versions:
            log = run_log(name, shapes, 2, version=version)
            placed = [r for r in log.records if isinstance(r.event, JobPlaced)]
            assert placed and {r.event.policy.version for r in placed} == {version}
            report = audit(log.records)
            assert report.ok, (name, version, report.mismatches[:3])
            assert report.verified >= len(placed)


def test_the_audit_re_makes_loom_v5_where_stranding_decides() -> None:
    """Node "c" has 12,000 CPU milli for its two GPUs while the one-GPU jobs ask 16,000
    each: CPU decides here, so v5's decisions differ from v4's, and the audit re-makes
    both."""
    shapes: list[dict[str, object]] = [
        {"gpus": 0, "cpu_milli": 4000},
        *[{"gpus": 1, "cpu_milli": 16_000}] * 3,
    ] * 4
    hosts: dict[int, list[list[str]]] = {}
    for version in (4, 5):
        log = run_log("loom", shapes, 0, version=version, cpu_of_c=12_000)
        placed = [r.event for r in log.records if isinstance(r.event, JobPlaced)]
        hosts[version] = [[replica.host for replica in e.replicas] for e in placed]
        report = audit(log.records)
        assert report.ok, (version, report.mismatches[:3])
        assert report.verified >= len(placed)
    assert hosts[5] != hosts[4]


def tampered(records: list[Recorded], index: int, **changes: object) -> list[Recorded]:
    original = records[index]
    assert isinstance(original.event, JobPlaced)
    event = original.event.model_copy(update=changes)
    return [
        *records[:index],
        Recorded(original.seq, original.envelope, event),
        *records[index + 1 :],
    ]


@pytest.mark.parametrize("policy", POLICIES)
def test_audit_catches_an_edited_decision(policy: str) -> None:
    shapes: list[dict[str, object]] = [{"gpus": 1}, {"gpus": 1, "gpu_milli": 250}, {"gpus": 2}]
    log = run_log(policy, shapes, 0)
    placed = [i for i, r in enumerate(log.records) if isinstance(r.event, JobPlaced)]
    assert audit(log.records).ok
    first = log.records[placed[0]].event
    assert isinstance(first, JobPlaced)
    moved = [
        tampered(log.records, placed[0], cycle_position=first.cycle_position + 1),
        tampered(log.records, placed[0], attempt=first.attempt + 1),
        tampered(
            log.records,
            placed[0],
            policy=first.policy.model_copy(update={"version": first.policy.version + 1}),
        ),
        tampered(log.records, placed[0], replicas=[]),
    ]
    if first.gpu_indexes:
        other = [i for i in range(4) if i not in first.gpu_indexes][:1] or [9]
        moved.append(tampered(log.records, placed[0], gpu_indexes=other))
    for records in moved:
        report = audit(records)
        assert not report.ok
        assert f"job {first.job_id}" in report.mismatches[0]


def test_audit_from_a_sequence_checks_only_later_decisions() -> None:
    log = run_log("bestfit", [{"gpus": 1}] * 5, 0)
    placed = [r.seq for r in log.records if isinstance(r.event, JobPlaced)]
    report = audit(log.records, from_seq=placed[2])
    assert report.verified == len(placed) - 2


def test_replay_shows_the_cluster_as_it_was() -> None:
    log = run_log("bestfit", [{"gpus": 1, "gpu_milli": 250}, {"gpus": 2}], 0)
    placed = [r for r in log.records if isinstance(r.event, JobPlaced)]
    before = snapshot(state_at(log.records, seq=placed[0].seq - 1))
    after = snapshot(state_at(log.records, seq=placed[0].seq))
    held_before = [g for n in before.nodes for g in n["gpus"] if g["holders"]]
    held_after = [g for n in after.nodes for g in n["gpus"] if g["holders"]]
    assert held_before == [] and len(held_after) == 1
    assert held_after[0]["milli_allocated"] == 250 and held_after[0]["pool"] == "vgpu"
    assert [q["id"] for q in before.queue] == ["j0"]
    by_time = snapshot(state_at(log.records, at=placed[0].envelope.at))
    assert by_time.seq == placed[0].seq

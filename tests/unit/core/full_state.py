"""A folded state with every field of every dataclass in it set to something other than
its default, for the snapshot round trip, and the check that it stays so."""

from __future__ import annotations

import dataclasses
import typing
from datetime import timedelta, timezone
from typing import Any, get_args, get_origin

from gpuloom.events import (
    AuditCompleted,
    Dependency,
    JobReserved,
    PolicyRef,
    QueuePolicySet,
    ReplicaAssignment,
    SliceRef,
)
from gpuloom.state import ClusterState, Voided, fold
from gpuloom.state.tenancy import AccountState, IdentityLimits, PriorityClass, Webhook
from gpuloom.testing.builders import make_job_spec

from .test_fold_determinism import story


def full_state() -> ClusterState:
    """The story's state, then by hand whatever its few events leave at a default.

    Not a state the fold could reach (a lost node still holds GPUs, ...): only its
    shape matters here. A field added to the model must be set here too, or
    `test_the_full_state_sets_every_field` names it.
    """
    state = fold(story())
    at = state.clock
    assert at is not None
    east = timezone(timedelta(hours=5, minutes=30))
    node = state.nodes["n1"]
    node.lost_at, node.cordoned, node.cordon_reason = at.astimezone(east), True, "maintenance"
    node.pool_overrides = {3: "vgpu"}
    node.hosted = {"b": (500, 1024)}
    node.gpus[3].pool, node.gpus[3].holders = "vgpu", {"b": (250, 2048), "q1": (500, 0)}
    job = state.jobs["b"]
    job.spec = RICH_SPEC
    job.reason, job.idempotency_key, job.cancel_requested = "Priority", "k-b", True
    job.array_id, job.array_index = "arr", 1
    job.preempted_by, job.preempted_at, job.charged_attempts = "a", at, [1, 2]
    job.yields_to = "a"
    job.master = ("10.0.0.7", 29501)
    run = job.runs[0]
    run.charges, run.charged_until, run.charged_milli_seconds = 2, at, 1234
    run.charged_by_model = {"H100-80GB": 1234}
    state.queued, state.submitted, state.admitted = {"q1", "q2"}, {"s1"}, {"ad1"}
    state.cancel_pending, state.arrays, state.dependents = {"q1"}, {"arr": 2}, {"a": {"b", "q1"}}
    state.queued_with_dependencies, state.queued_yielding = {"q2"}, {"q1"}
    state.faults, state.skewed = 1, 2
    state.recent_voided.append(Voided(seq=7, type="JobStarted", reason="boom", fault=True))
    state.recent_skewed = [Voided(seq=8, type="JobFinished", reason="at 3 h ahead")]
    state.accounts = {
        "team-a": AccountState(
            name="team-a",
            parent="root",
            shares=3,
            description="Team A",
            users=("alice", "bob"),
            coordinators=("carol",),
            quotas={"gpu_milli": (8000, 2000, None), "gpus": (8, None, 16)},
        )
    }
    state.priority_classes = {
        "high": PriorityClass(
            name="high",
            priority=100,
            may_preempt=False,
            users=("alice",),
            accounts=("team-a",),
            description="urgent",
            default=True,
        )
    }
    state.limits = {
        ("user", "alice"): IdentityLimits(max_submit_jobs=10, max_array_size=5, max_gpus=3),
        ("account", "team,a"): IdentityLimits(max_gpus=8),
    }
    state.live_jobs = {("user", "alice"): 2, ("account", "team,a"): 1, ("cluster", "all"): 2}
    state.webhooks = {
        "wh1": Webhook(
            webhook_id="wh1", owner="alice", operator=True, url="https://h.example/x",
            types=("JobFinished",), job="j1", user="alice", account="team-a", node="n1",
            secret_sealed="v1.a.b", description="ci", registered_seq=7,
            registered_at=at.astimezone(east), disabled="410 Gone",
            operator_until=at.astimezone(east),
        )
    }  # fmt: skip
    state.last_audit = AuditCompleted(
        audit_id="audit-1", from_seq=1, to_seq=20, verified=3, mismatch_count=1,
        mismatches=["seq 9: JobPlaced differs"], seconds=0.25,
    )  # fmt: skip
    state.queue_policy = QueuePolicySet(
        weight_age=1, weight_fair_share=2, weight_size=3, max_age_s=60.5,
        fair_share_half_life_s=3600.0, backfill="off", preemption=False, victims_yield=True,
    )  # fmt: skip
    piece = SliceRef(node="n2", index=0, uuid="GPU-n2-0", milli=250, memory_mib=4096)
    state.reservation = JobReserved(
        job_id="q1",
        start_at=at.astimezone(east),
        replicas=[ReplicaAssignment(host="n1", slices=[piece], cpu_milli=100, memory_mib=64)],
        basis_seq=12,
        cycle_position=1,
        policy=PolicyRef(name="best-fit", version=2, params={"w": 1.5, "tiers": [1, "x"]}),
    )
    _retention_fields(state)
    return state


#: A spec with every field away from its default (the event models travel whole too).
RICH_SPEC = make_job_spec(
    2,
    name="rich",
    user="bob",
    account="team-a",
    gpu_model=["H100-80GB", "A100-80GB"],
    priority=7,
    command=["python", "-c", "print('héllo')"],
    time_limit_s=3600,
    env={"CUDA_CACHE": "/tmp/ç", "EMPTY": ""},
    gpu_milli=250,
    gpu_memory_mib=4096,
    cpu_milli=1500,
    memory_mib=2048,
    pool="vgpu",
    locality="any",
    node_selector={"zone": "b", "rack": "r1"},
    replicas=2,
    depends_on=[Dependency(job="a"), Dependency(job="c", when="finished")],
    array=3,
    priority_class="high",
    preemptible=True,
)


def _retention_fields(state: ClusterState) -> None:
    """What retention.py keeps (tombstones the story's fold made, and the rest by hand)."""
    state.keep_history, state.retired_head = True, 1
    state.array_left = {"arr": (2, "k-arr"), "arr2": (1, None)}
    state.forgotten_by_phase["timed_out"] = 3
    first = min(state.tombstones)
    state.tombstones[first] = dataclasses.replace(state.tombstones[first], array_id="arr")


def reachable_dataclasses(root: type) -> set[type]:
    """Every dataclass the fields of `root` can hold, `root` included."""
    seen: set[type] = set()
    todo: list[Any] = [root]
    while todo:
        tp = todo.pop()
        if isinstance(tp, type) and dataclasses.is_dataclass(tp):
            if tp not in seen:
                seen.add(tp)
                hints = typing.get_type_hints(tp)
                todo.extend(hints[f.name] for f in dataclasses.fields(tp) if f.compare)
        else:
            todo.extend(get_args(tp) if get_origin(tp) is not typing.Literal else ())
    return seen


def unpopulated(state: ClusterState) -> list[str]:
    """`Class.field` of every value field never set to other than its default in `state`
    (a field without a default counts once an instance exists)."""
    populated: set[str] = set()
    _collect(state, populated)
    wanted = {
        f"{cls.__name__}.{f.name}"
        for cls in reachable_dataclasses(ClusterState)
        for f in dataclasses.fields(cls)
        if f.compare
    }
    return sorted(wanted - populated)


def _default(field: dataclasses.Field[Any]) -> object:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return dataclasses.MISSING


def _collect(value: object, populated: set[str]) -> None:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            if not f.compare:
                continue
            inner = getattr(value, f.name)
            default = _default(f)
            if default is dataclasses.MISSING or inner != default:
                populated.add(f"{type(value).__name__}.{f.name}")
            _collect(inner, populated)
    elif isinstance(value, dict):
        for key, item in value.items():
            _collect(key, populated)
            _collect(item, populated)
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            _collect(item, populated)

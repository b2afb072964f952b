"""The wire contract: envelopes encode and decode, bad bytes are refused, old payloads upcast."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import orjson
import pytest
from pydantic import ValidationError

from gpuloom.events import (
    ALL_EVENT_CLASSES,
    EVENT_TYPES,
    AccountCoordinatorsSet,
    AccountCreated,
    AccountUsersSet,
    AuditCompleted,
    Dependency,
    Event,
    GpuHealthy,
    GpuPoolChanged,
    GpuUnhealthy,
    JobAdmitted,
    JobArraySubmitted,
    JobCancelled,
    JobCancelRequested,
    JobFinished,
    JobGrown,
    JobPlaced,
    JobPreempted,
    JobQueued,
    JobRejected,
    JobReserved,
    JobShrunk,
    JobStarted,
    JobSubmitted,
    LimitsSet,
    MalformedEvent,
    NodeCordoned,
    NodeLost,
    NodeRecovered,
    NodeRegistered,
    NodeRemoved,
    NodeUncordoned,
    PolicyRef,
    PriorityClassDeleted,
    PriorityClassSet,
    QueuePolicySet,
    QuotaSet,
    ReplicaAssignment,
    ReservationCreated,
    ReservationDeleted,
    ReservationEnded,
    ReservationSpec,
    ReservationStarted,
    ReservationUpdated,
    ReservedGpu,
    SharesSet,
    SliceRef,
    UsageCharged,
    WebhookDeleted,
    WebhookDisabled,
    WebhookRegistered,
    WebhookRenewed,
    decode,
    encode,
    json_schemas,
    make_envelope,
    subject_for,
)
from gpuloom.events import upcasters as upcasters_module
from gpuloom.events.cloud import event_type_named, to_cloudevent
from gpuloom.events.codec import Recorded
from gpuloom.events.upcasters import UPCASTERS, UnknownVersionError, upcast
from gpuloom.testing.builders import T0, make_job_spec, make_node_spec

RESERVATION_SPEC = ReservationSpec(
    start=datetime(2026, 1, 1, 8, tzinfo=UTC),
    end=datetime(2026, 1, 1, 20, tzinfo=UTC),
    gpus=[ReservedGpu(node="n1", index=1), ReservedGpu(node="n1", index=0)],
    users=["bob", "alice"],
    accounts=["research"],
    flags=["ignore_jobs"],
    description="the big run",
)

EXAMPLES: dict[type[Event], Event] = {
    JobSubmitted: JobSubmitted(
        job_id="j1",
        spec=make_job_spec(2, gpu_model=["A100-80GB"], priority=5, env={"SEED": "1"}),
        idempotency_key="key-1",
    ),
    JobCancelRequested: JobCancelRequested(job_id="j1", requested_by="alice"),
    JobArraySubmitted: JobArraySubmitted(
        job_id="a1", spec=make_job_spec(gpus=0, array=3), idempotency_key="sweep-1"
    ),
    JobAdmitted: JobAdmitted(job_id="j1"),
    JobRejected: JobRejected(job_id="j1", reason="no node has GPU model B200"),
    JobQueued: JobQueued(job_id="j1", priority=5),
    JobCancelled: JobCancelled(job_id="j1", reason="cancelled by user"),
    JobPlaced: JobPlaced(
        job_id="j1",
        attempt=1,
        node="n1",
        gpu_indexes=[0, 1],
        gpu_uuids=["GPU-n1-0", "GPU-n1-1"],
        basis_seq=7,
        cycle_position=0,
        policy=PolicyRef(name="bestfit", version=1, params={"spread": False}),
    ),
    JobStarted: JobStarted(job_id="j1", attempt=1, node="n1", pid=123),
    JobFinished: JobFinished(
        job_id="j1", attempt=1, node="n1", outcome="failed", exit_code=3, reason="oom"
    ),
    UsageCharged: UsageCharged(
        job_id="j1",
        attempt=1,
        user="alice",
        account="research",
        gpus=2,
        seconds=1.5,
        gpu_milli_seconds=3000,
    ),
    NodeRegistered: NodeRegistered(node="n1", spec=make_node_spec("n1", 2, labels={"rack": "a"})),
    NodeLost: NodeLost(node="n1", reason="no heartbeat for 12.0s"),
    NodeRecovered: NodeRecovered(node="n1"),
    GpuPoolChanged: GpuPoolChanged(node="n1", index=0, pool="vgpu"),
    GpuUnhealthy: GpuUnhealthy(
        node="n1", index=0, uuid="GPU-1", check="xid", evidence="Xid 79: fallen off the bus"
    ),
    GpuHealthy: GpuHealthy(node="n1", index=0, reason="reseated"),
    NodeCordoned: NodeCordoned(node="n1", reason="maintenance"),
    NodeUncordoned: NodeUncordoned(node="n1"),
    NodeRemoved: NodeRemoved(node="n1", reason="decommissioned"),
    QueuePolicySet: QueuePolicySet(weight_age=10, fair_share_half_life_s=3600.0),
    AccountCreated: AccountCreated(account="ml-team", parent="org", description="ML"),
    SharesSet: SharesSet(account="ml-team", shares=3),
    AccountUsersSet: AccountUsersSet(account="ml-team", users=["alice", "bob"]),
    AccountCoordinatorsSet: AccountCoordinatorsSet(account="ml-team", coordinators=["carol"]),
    QuotaSet: QuotaSet(account="ml-team", nominal=4000, borrowing_limit=2000, cap=8000),
    JobReserved: JobReserved(
        job_id="j2",
        start_at=T0,
        replicas=[
            ReplicaAssignment(
                host="n1",
                slices=[SliceRef(node="n1", index=0, uuid="u0", milli=1000, memory_mib=0)],
            )
        ],
        basis_seq=9,
        cycle_position=1,
        policy=PolicyRef(name="bestfit", version=2),
    ),
    JobPreempted: JobPreempted(
        job_id="j1",
        attempt=1,
        by="j2",
        reason="priority",
        basis_seq=9,
        cycle_position=0,
        policy=PolicyRef(name="bestfit", version=2),
    ),
    JobGrown: JobGrown(
        job_id="j1",
        attempt=1,
        first=2,
        replicas=[
            ReplicaAssignment(
                host="n2",
                slices=[SliceRef(node="n2", index=1, uuid="u1", milli=1000, memory_mib=0)],
            )
        ],
        basis_seq=9,
        cycle_position=0,
        policy=PolicyRef(name="bestfit", version=2),
    ),
    JobShrunk: JobShrunk(
        job_id="j1",
        attempt=1,
        replicas=[2, 3],
        by="j2",
        reason="priority",
        basis_seq=9,
        cycle_position=0,
        policy=PolicyRef(name="bestfit", version=2),
    ),
    AuditCompleted: AuditCompleted(
        audit_id="a1", from_seq=1, to_seq=9, verified=3, mismatch_count=0, seconds=0.5
    ),
    PriorityClassSet: PriorityClassSet(
        name="urgent", priority=1000, may_preempt=False, users=["bob", "alice"], default=True
    ),
    PriorityClassDeleted: PriorityClassDeleted(name="urgent"),
    ReservationCreated: ReservationCreated(name="big", spec=RESERVATION_SPEC),
    ReservationUpdated: ReservationUpdated(name="big", spec=RESERVATION_SPEC),
    ReservationDeleted: ReservationDeleted(name="big"),
    ReservationStarted: ReservationStarted(name="big"),
    ReservationEnded: ReservationEnded(name="big"),
    LimitsSet: LimitsSet(scope="user", name="alice@example.org", max_submit_jobs=10, max_gpus=4),
    WebhookRegistered: WebhookRegistered(
        webhook_id="wh1",
        owner="alice",
        url="https://ci.example.org/hooks/gpuloom",
        types=["JobFinished"],
        secret_sealed="v1.bm9uY2U.c2VhbGVk",
    ),
    WebhookDeleted: WebhookDeleted(webhook_id="wh1"),
    WebhookDisabled: WebhookDisabled(webhook_id="wh1", reason="the receiver answered 410 Gone"),
    WebhookRenewed: WebhookRenewed(
        webhook_id="wh1", operator=True, operator_until=datetime(2026, 12, 5, tzinfo=UTC)
    ),
}


def envelope_bytes(event_type: str, v: int, data: dict[str, Any], **overrides: Any) -> bytes:
    doc = {
        "id": "evt-1",
        "type": event_type,
        "v": v,
        "at": T0.isoformat(),
        "by": "test",
        "data": data,
        **overrides,
    }
    return orjson.dumps(doc)


def test_there_is_one_example_of_every_event_class() -> None:
    assert set(EXAMPLES) == set(ALL_EVENT_CLASSES)


@pytest.mark.parametrize(
    "event",
    [EXAMPLES[cls] for cls in ALL_EVENT_CLASSES],
    ids=[f"{cls.TYPE} survives encode then decode" for cls in ALL_EVENT_CLASSES],
)
def test_round_trip(event: Event) -> None:
    envelope = make_envelope(
        event, at=T0, by="test", event_id="evt-1", correlation_id="c-1", causation_id="evt-0"
    )
    recorded = decode(42, encode(envelope))
    assert recorded.seq == 42
    assert recorded.envelope == envelope
    assert type(recorded.event) is type(event)
    assert recorded.event == event
    assert recorded.envelope.at == T0


def test_make_envelope_names_type_and_version_and_dumps_the_payload() -> None:
    event = EXAMPLES[JobQueued]
    envelope = make_envelope(event, at=T0, by="queue")
    assert (envelope.type, envelope.v, envelope.by) == ("JobQueued", 1, "queue")
    assert envelope.data == {"job_id": "j1", "priority": 5}
    assert envelope.id, "a fresh id is made when none is given"


def test_subject_names_aggregate_id_and_type() -> None:
    assert subject_for(EXAMPLES[JobQueued]) == "gpuloom.evt.job.j1.JobQueued"
    assert subject_for(EXAMPLES[NodeLost]) == "gpuloom.evt.node.n1.NodeLost"


MALFORMED = [
    pytest.param(b"{not json", "not an event envelope", id="bytes that are not JSON"),
    pytest.param(b"[1, 2]", "not an event envelope", id="JSON that is not an object"),
    pytest.param(
        orjson.dumps({"id": "e", "type": "JobAdmitted", "v": 1, "data": {"job_id": "j"}}),
        "not an event envelope",
        id="an envelope without at and by",
    ),
    pytest.param(
        envelope_bytes("JobTeleported", 1, {"job_id": "j1"}),
        "unknown event type 'JobTeleported'",
        id="an unknown event type",
    ),
    pytest.param(
        envelope_bytes("JobQueued", 1, {"job_id": "j1"}),
        "invalid JobQueued payload",
        id="a payload missing a field",
    ),
    pytest.param(
        envelope_bytes("JobQueued", 1, {"job_id": "j1", "extra": 1, "priority": "x"}),
        "invalid JobQueued payload",
        id="an unknown field beside a wrong one",
    ),
    pytest.param(
        envelope_bytes("JobAdmitted", 1, {"job_id": "a.b"}),
        "invalid JobAdmitted payload",
        id="a job id that is not a subject token",
    ),
    pytest.param(
        envelope_bytes("JobAdmitted", 2, {"job_id": "j1"}),
        "newer than this code",
        id="a version newer than the code",
    ),
    pytest.param(
        envelope_bytes("JobAdmitted", 0, {"job_id": "j1"}),
        "no upcaster for JobAdmitted v0",
        id="an old version without an upcaster",
    ),
]


@pytest.mark.parametrize(("raw", "message"), MALFORMED)
def test_decode_refuses_malformed_bytes_with_a_reason(raw: bytes, message: str) -> None:
    with pytest.raises(MalformedEvent, match=message) as caught:
        decode(7, raw)
    assert str(caught.value).startswith("seq 7: ")


def test_a_reader_ignores_fields_a_newer_writer_added_at_any_depth() -> None:
    """Rolling upgrade: an older reader folds an enriched event as it knows it."""
    event = JobSubmitted(job_id="j1", spec=make_job_spec(depends_on=[Dependency(job="j0")]))
    data = event.model_dump(mode="json")
    data["placement_hint"] = {"rack": "r1"}
    data["spec"]["checkpoint_dir"] = "/ckpt"
    data["spec"]["depends_on"][0]["delay_s"] = 5
    raw = envelope_bytes("JobSubmitted", JobSubmitted.VERSION, data)
    assert decode(7, raw).event == event
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        JobSubmitted.model_validate(data)  # building an event still refuses a stray field


# --- upcasters ------------------------------------------------------------------------


def _v1_to_v2(payload: dict[str, Any]) -> dict[str, Any]:
    out = dict(payload)
    out["gpus"] = out.pop("gpu_count")
    return out


def _v2_to_v3(payload: dict[str, Any]) -> dict[str, Any]:
    return {**payload, "gpu_model": [payload["model"]] if payload.get("model") else []}


CHAIN = {("Thing", 1): _v1_to_v2, ("Thing", 2): _v2_to_v3}


def test_upcast_chain_turns_v1_into_v3() -> None:
    v1 = {"gpu_count": 2, "model": "A100"}
    assert upcast("Thing", 1, v1, 3, upcasters=CHAIN) == {
        "gpus": 2,
        "model": "A100",
        "gpu_model": ["A100"],
    }
    assert v1 == {"gpu_count": 2, "model": "A100"}, "the input payload is left alone"


def test_upcast_starts_from_the_stored_version() -> None:
    v2 = {"gpus": 1, "model": None}
    assert upcast("Thing", 2, v2, 3, upcasters=CHAIN) == {**v2, "gpu_model": []}


def test_upcast_at_the_current_version_returns_the_payload() -> None:
    assert upcast("Thing", 3, {"x": 1}, 3, upcasters=CHAIN) == {"x": 1}


def test_upcast_with_a_missing_step_names_it() -> None:
    partial = {("Thing", 1): _v1_to_v2}
    with pytest.raises(UnknownVersionError, match="no upcaster for Thing v2"):
        upcast("Thing", 1, {"gpu_count": 1}, 3, upcasters=partial)


def test_upcast_of_a_too_new_version_says_so() -> None:
    with pytest.raises(UnknownVersionError, match=r"Thing v4 is newer than this code \(v3\)"):
        upcast("Thing", 4, {}, 3, upcasters=CHAIN)


def test_decode_upcasts_an_old_payload_through_the_registered_chain(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def rename(payload: dict[str, Any]) -> dict[str, Any]:
        return {"job_id": payload["job"], "priority": payload["prio"]}

    monkeypatch.setitem(upcasters_module.UPCASTERS, ("JobQueued", 0), rename)
    recorded = decode(3, envelope_bytes("JobQueued", 0, {"job": "j1", "prio": 4}))
    assert recorded.event == JobQueued(job_id="j1", priority=4)
    assert recorded.envelope.v == 0, "the envelope keeps the version it was written at"


def test_a_v1_limits_set_reads_as_v2_unchanged() -> None:
    payload = {"scope": "user", "name": "alice", "max_submit_jobs": 3}
    recorded = decode(3, envelope_bytes("LimitsSet", 1, payload))
    assert recorded.event == LimitsSet(scope="user", name="alice", max_submit_jobs=3)


def test_every_event_class_has_a_complete_upcaster_chain() -> None:
    for cls in ALL_EVENT_CLASSES:
        missing = [v for v in range(1, cls.VERSION) if (cls.TYPE, v) not in UPCASTERS]
        assert not missing, f"{cls.TYPE} lacks upcasters from versions {missing}"
    for event_type, version in UPCASTERS:
        assert event_type in EVENT_TYPES
        assert version < EVENT_TYPES[event_type].VERSION


# --- registry and schemas -------------------------------------------------------------


def test_registry_maps_every_type_name_to_its_class() -> None:
    assert {cls.TYPE: cls for cls in ALL_EVENT_CLASSES} == EVENT_TYPES
    assert len(EVENT_TYPES) == len(ALL_EVENT_CLASSES), "no type name is used twice"


def test_json_schemas_cover_every_type_with_version_and_aggregate() -> None:
    schemas = json_schemas()
    assert list(schemas) == sorted(cls.TYPE for cls in ALL_EVENT_CLASSES)
    for cls in ALL_EVENT_CLASSES:
        entry = schemas[cls.TYPE]
        assert isinstance(entry, dict)
        assert entry["v"] == cls.VERSION
        assert entry["aggregate"] == cls.AGGREGATE
        id_field = {"job": "job_id", "node": "node", "audit": "audit_id", "account": "account"}.get(
            cls.AGGREGATE
        )
        if id_field is not None:  # the queue policy is one aggregate, "policy"
            assert id_field in entry["schema"]["properties"]


def test_events_are_frozen_and_refuse_unknown_fields() -> None:
    event = JobQueued(job_id="j1", priority=5)
    with pytest.raises(ValueError, match="frozen"):
        event.priority = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="Extra inputs"):
        JobQueued(job_id="j1", priority=1, colour="red")  # type: ignore[call-arg]


def test_a_type_filter_may_name_the_cloudevents_type_the_events_carry() -> None:
    """`GET /v1/events?type=` takes `JobFinished`, or `io.gpuloom.job.JobFinished.v1` as
    copied from an event of the stream; anything else stays as it is, to be refused."""
    finished = EXAMPLES[JobFinished]
    envelope = make_envelope(finished, at=datetime(2026, 1, 1, tzinfo=UTC), by="agent")
    carried = to_cloudevent(Recorded(1, envelope, finished))
    assert event_type_named(carried["type"]) == "JobFinished"
    assert event_type_named("JobFinished") == "JobFinished"
    assert event_type_named("io.gpuloom.job.JobFinished.v7") == "JobFinished"
    for wrong in ("io.gpuloom.node.JobFinished.v1", "io.gpuloom.job.Nope.v1", "io.x.job.JobFinished.v1",
                  "io.gpuloom.job.JobFinished.x1", "io.gpuloom.job.JobFinished"):  # fmt: skip
        assert event_type_named(wrong) == wrong

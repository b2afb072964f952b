"""The HTTP body of a job (`JobRequest`) and the event payload (`JobSpec`) are two
models kept in step on purpose: every field of the event is carried by the request
(with the same type and checks), decided by the gateway (`DECIDED`) or left out
(`LEFT_OUT`), and `job_spec` copies each one."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from gpuloom.events import Dependency, JobSpec
from gpuloom.events.jobs import CheckpointSignal, TopologyRequest
from services.gateway.jobs import requests
from services.gateway.jobs.requests import DECIDED, LEFT_OUT, RESHAPED, JobRequest
from services.gateway.jobs.submitting import job_spec

#: A request that sets every field, none to its default.
EVERY_FIELD: dict[str, Any] = {
    "name": "train",
    "user": "bob",
    "account": "research",
    "command": ["python", "train.py"],
    "gpus": 2,
    "gpu_milli": 500,
    "gpu_memory_mib": 4096,
    "gpu_model": ["A100"],
    "cpu_milli": 2000,
    "memory_mib": 8192,
    "pool": "vgpu",
    "locality": "any",
    "node_selector": {"zone": "a"},
    "replicas": 2,
    "depends_on": [{"job": "j0", "when": "finished"}],
    "array": 3,
    "priority": 7,
    "priority_class": "high",
    "preemptible": True,
    "time_limit_s": 600,
    "env": {"SEED": "1"},
    "image": "ghcr.io/acme/train:1",
    "topology": {"level": "rack", "mode": "preferred"},
    "reservation": "window",
    "signal": {"name": "USR1", "before_s": 60},
}


def _shape(field: FieldInfo) -> tuple[Any, str, Any]:
    """What a field accepts: its type, its constraints and its default."""
    return field.annotation, repr(field.metadata), field.get_default(call_default_factory=True)


def _property(model: type[BaseModel], name: str) -> dict[str, Any]:
    schema = model.model_json_schema()["properties"][name]
    return {key: value for key, value in schema.items() if key not in ("default", "title")}


def _or_none(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` that also takes null (`T | None`), written one way."""
    choices = schema.get("anyOf", [schema])
    null = {"type": "null"}
    return {"anyOf": [c for c in choices if c != null] + [null]}


def _same_fields(
    request: type[BaseModel], event: type[BaseModel], left_out: frozenset[str]
) -> None:
    carried = set(request.model_fields)
    assert carried <= set(event.model_fields), "a request field the event would drop"
    assert carried.isdisjoint(left_out)
    missing = set(event.model_fields) - carried - left_out
    assert not missing, f"JobSpec fields neither carried nor left out on purpose: {missing}"


def test_every_event_field_is_carried_or_left_out_on_purpose() -> None:
    _same_fields(JobRequest, JobSpec, LEFT_OUT | RESHAPED)
    _same_fields(requests.Dependency, Dependency, frozenset())
    _same_fields(requests.TopologyRequest, TopologyRequest, frozenset())
    _same_fields(requests.CheckpointSignal, CheckpointSignal, frozenset())
    assert set(JobRequest.model_fields) >= DECIDED
    assert set(EVERY_FIELD) == set(JobRequest.model_fields)


def test_a_carried_field_accepts_what_the_event_accepts() -> None:
    for name, field in JobRequest.model_fields.items():
        event = JobSpec.model_fields[name]
        if name in ("depends_on", "topology", "signal"):  # a model of its own on each side
            assert repr(field.metadata) == repr(event.metadata)
        elif name == "replicas":  # a number as the event's, or an elastic gang's range
            count = JobRequest.model_json_schema()["properties"]["replicas"]["oneOf"][0]
            assert count == {k: v for k, v in _property(JobSpec, name).items()}
        elif name in DECIDED:  # optional here: the gateway fills it in
            assert field.default is None, name
            assert _or_none(_property(JobRequest, name)) == _or_none(_property(JobSpec, name))
        else:
            assert _shape(field) == _shape(event), name
    for name, field in requests.Dependency.model_fields.items():
        assert _shape(field) == _shape(Dependency.model_fields[name]), name
    for name, field in requests.TopologyRequest.model_fields.items():
        assert _shape(field) == _shape(TopologyRequest.model_fields[name]), name
    for name, field in requests.CheckpointSignal.model_fields.items():
        assert _shape(field) == _shape(CheckpointSignal.model_fields[name]), name


def test_job_spec_copies_every_field_and_sets_the_decided_ones() -> None:
    request = JobRequest.model_validate(EVERY_FIELD)
    spec = job_spec(request, "carol", 5, "normal")
    assert (spec.user, spec.priority, spec.priority_class) == ("carol", 5, "normal")
    dumped = spec.model_dump()
    for name in set(JobRequest.model_fields) - DECIDED:
        assert dumped[name] == EVERY_FIELD[name], name


def test_a_minimal_request_becomes_the_events_defaults() -> None:
    request = JobRequest(name="n", account="a", command=["true"], gpus=0)
    spec = job_spec(request, "alice", 0, "default")
    expected = JobSpec(
        name="n", user="alice", account="a", command=["true"], gpus=0, priority_class="default"
    )
    assert spec == expected


@pytest.mark.parametrize(
    "change",
    [
        {"command": [""]},
        {"gpus": 0, "gpu_milli": 500},
        {"pool": "physical"},
        {"gpu_milli": None, "gpu_memory_mib": 1024},
        {"gpus": 1025},
        {"account": "a.b"},
        {"depends_on": [{"job": "j*"}]},
        {"env": {"": "x"}},
        {"unknown": 1},
        {"signal": {"name": "USR1", "before_s": 600}},
        {"signal": {"name": "KILL", "before_s": 60}},
    ],
    ids=[
        "an empty program",
        "a fraction of no GPU",
        "a fraction from the physical pool",
        "GPU memory without a fraction",
        "too many GPUs",
        "an account that is no subject token",
        "a dependency on a wildcard",
        "an empty env name",
        "an unknown field",
        "a signal at the time limit",
        "a signal that cannot be caught",
    ],
)
def test_the_request_refuses_what_the_event_refuses_with_the_same_errors(
    change: dict[str, Any],
) -> None:
    body = {**EVERY_FIELD, **change}
    with pytest.raises(ValidationError) as request_error:
        JobRequest.model_validate(body)
    with pytest.raises(ValidationError) as event_error:
        JobSpec.model_validate(body)
    assert _errors(request_error.value) == _errors(event_error.value)


def _errors(error: ValidationError) -> list[tuple[Any, ...]]:
    return [(e["type"], e["loc"], e["msg"]) for e in error.errors()]


def test_an_elastic_gang_is_a_range_of_replicas() -> None:
    request = JobRequest.model_validate({**EVERY_FIELD, "replicas": {"min": 2, "max": 4}})
    spec = job_spec(request, "carol", 5, "normal")
    assert (spec.replicas, spec.min_replicas, spec.elastic) == (4, 2, True)
    plain = job_spec(JobRequest.model_validate(EVERY_FIELD), "carol", 5, "normal")
    assert (plain.replicas, plain.min_replicas, plain.elastic) == (2, None, False)


@pytest.mark.parametrize(
    ("replicas", "loc", "says"),
    [
        ({"min": 3, "max": 2}, ("replicas", "range"), "replicas.min (3) must be at most"),
        ({"min": 1}, ("replicas", "range", "max"), "Field required"),
        ({"min": 0, "max": 2}, ("replicas", "range", "min"), "greater than or equal to 1"),
        (0, ("replicas", "count"), "greater than or equal to 1"),
        (True, ("replicas",), "must be a number"),
        ("2", ("replicas",), "must be a number"),
    ],
)
def test_a_bad_replica_range_is_refused_naming_the_field(
    replicas: object, loc: tuple[str, ...], says: str
) -> None:
    with pytest.raises(ValidationError) as error:
        JobRequest.model_validate({**EVERY_FIELD, "replicas": replicas})
    [problem] = error.value.errors()
    assert problem["loc"] == loc and says in problem["msg"]

"""Request bodies take JSON's numbers and booleans as the OpenAPI document states them:
`true` is no number and 0 no boolean (`services.gateway.bodies`), each refused naming
its field, while an integral `5.0`, which JSON Schema counts an integer, stays valid."""

from __future__ import annotations

import json

import pytest
from pydantic import ValidationError

from services.gateway.accounts.routes import QuotaBody, Shares
from services.gateway.cluster.policies import PriorityClassBody
from services.gateway.jobs.requests import JobRequest

JOB = {"name": "j", "account": "a", "gpus": 1, "command": ["true"]}


@pytest.mark.parametrize(
    ("model", "body", "field", "message"),
    [
        (QuotaBody, {"nominal": 1000, "cap": False}, "cap", "must be a number"),
        (Shares, {"shares": False}, "shares", "must be a number"),
        (Shares, {"shares": "5"}, "shares", "must be a number"),
        (PriorityClassBody, {"priority": 5, "default": 0}, "default", "must be true or false"),
        (PriorityClassBody, {"priority": 5, "may_preempt": "yes"}, "may_preempt", "true or false"),
        (JobRequest, {**JOB, "gpus": True}, "gpus", "must be a number"),
        (JobRequest, {**JOB, "preemptible": 1}, "preemptible", "must be true or false"),
    ],
)
def test_a_value_of_another_json_type_is_refused_naming_its_field(
    model: type, body: dict[str, object], field: str, message: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        model.model_validate_json(json.dumps(body))
    errors = refused.value.errors()
    assert [e["loc"] for e in errors] == [(field,)], errors
    assert message in errors[0]["msg"]


def test_json_numbers_and_booleans_pass_as_the_schema_says() -> None:
    assert Shares.model_validate_json('{"shares": 5.0}').shares == 5
    quota = QuotaBody.model_validate_json('{"nominal": 1000, "cap": null}')
    assert quota.cap is None and quota.nominal == 1000
    klass = PriorityClassBody.model_validate_json('{"priority": 5, "default": true}')
    assert klass.default is True
    job = JobRequest.model_validate_json(json.dumps({**JOB, "preemptible": True}))
    assert job.gpus == 1 and job.preemptible is True

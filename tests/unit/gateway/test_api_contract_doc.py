"""The OpenAPI document says what the gateway answers, in process (no NATS): every
error of every operation is `application/problem+json`, a 422 is the documented
ValidationProblem, the usage reports are JSON or CSV, and a 405 names in `Allow`
every method of its path. (tests/integration/test_api_contract.py runs schemathesis
against the real gateway.)"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
from fastapi import FastAPI

from gpuloom.auth import issue_token, read_secret
from gpuloom.config import Settings
from services.gateway.apidocs import keys_as_property_names
from services.gateway.app import create_app

PROBLEM = "application/problem+json"


@pytest.fixture
def app(tmp_path: Path) -> FastAPI:
    return create_app(
        Settings(database_url=f"sqlite+aiosqlite:///{tmp_path}/gw.db", data_dir=tmp_path)
    )


async def call(app: FastAPI, method: str, path: str, token: str | None = None) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        return await http.request(method, path, headers=headers)


def token(tmp_path: Path, user: str) -> str:
    secret = read_secret(tmp_path / "auth" / "jwt.key")
    return issue_token(secret, user, now=datetime.now(UTC), ttl_s=600)


def operations(doc: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method.upper(), path, operation)
        for path, item in doc["paths"].items()
        for method, operation in item.items()
    ]


def test_an_authenticated_route_documents_its_errors_as_problem_details(app: FastAPI) -> None:
    responses = app.openapi()["paths"]["/v1/jobs/{job_id}"]["get"]["responses"]
    for status in ("401", "403", "404", "422", "503"):
        assert list(responses[status]["content"]) == [PROBLEM], status
    schema = responses["422"]["content"][PROBLEM]["schema"]
    assert schema == {"$ref": "#/components/schemas/ValidationProblem"}
    assert responses["401"]["headers"]["WWW-Authenticate"]["required"] is True
    assert "Retry-After" in responses["503"]["headers"]


def test_every_error_of_every_operation_is_problem_details(app: FastAPI) -> None:
    doc = app.openapi()
    assert "HTTPValidationError" not in doc["components"]["schemas"]
    for method, path, operation in operations(doc):
        for status, response in operation["responses"].items():
            if int(status) < 400 or (path, status) == ("/readyz", "503"):  # its readiness
                continue
            assert list(response["content"]) == [PROBLEM], (method, path, status)


@pytest.mark.parametrize(
    ("path", "statuses"),
    [
        ("/healthz", {"200"}),
        ("/readyz", {"200", "503"}),
        ("/v1/schemas/events", {"200", "401", "403"}),
    ],
    ids=["liveness", "readiness", "a route reading nothing"],
)
def test_only_what_a_route_can_answer_is_documented(
    app: FastAPI, path: str, statuses: set[str]
) -> None:
    assert set(app.openapi()["paths"][path]["get"]["responses"]) == statuses


def test_a_body_or_a_parameter_may_be_refused_and_a_body_be_unreadable(app: FastAPI) -> None:
    for method, path, operation in operations(app.openapi()):
        if operation.get("parameters") or "requestBody" in operation:
            assert "422" in operation["responses"], (method, path)
        if "requestBody" in operation:
            assert {"400", "413"} <= set(operation["responses"]), (method, path)


def test_the_usage_reports_are_json_or_csv(app: FastAPI) -> None:
    paths = app.openapi()["paths"]
    for path in ("/v1/usage", "/v1/usage/jobs"):
        content = paths[path]["get"]["responses"]["200"]["content"]
        assert set(content) == {"application/json", "text/csv"}


def test_the_submit_schema_says_what_jobspec_checks(app: FastAPI) -> None:
    request = app.openapi()["components"]["schemas"]["JobRequest"]
    assert request["properties"]["command"]["prefixItems"][0]["minLength"] == 1
    env = request["properties"]["env"]
    assert "patternProperties" not in env
    assert "=" in env["propertyNames"]["pattern"]
    fraction = {"name": "f", "account": "a", "command": ["x"], "gpus": 0, "gpu_milli": 500}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(fraction, request)
    jsonschema.validate({**fraction, "gpus": 1}, request)
    job = {**fraction, "gpus": 1, "env": {"LD_LIBRARY_PATH": "/opt"}, "time_limit_s": 30 * 86400}
    jsonschema.validate(job, request)
    for wrong in (
        {"env": {"LD_PRELOAD": "x"}},
        {"command": [""]},
        {"time_limit_s": 30 * 86400 + 1},
    ):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**job, **wrong}, request)


def test_dictionary_keys_become_property_names() -> None:
    node = {"type": "object", "patternProperties": {"^a$": {"type": "string"}}}
    assert keys_as_property_names({"x": [node]}) == {
        "x": [
            {
                "type": "object",
                "propertyNames": {"pattern": "^a$"},
                "additionalProperties": {"type": "string"},
            }
        ]
    }


async def test_a_422_is_the_documented_validation_problem(app: FastAPI, tmp_path: Path) -> None:
    response = await call(app, "GET", "/v1/jobs?limit=0", token(tmp_path, "alice"))
    assert response.status_code == 422
    assert response.headers["content-type"] == PROBLEM
    body = response.json()
    assert body["errors"][0]["loc"] == ["query", "limit"]
    doc = app.openapi()
    schema = {**doc["components"]["schemas"]["ValidationProblem"], "components": doc["components"]}
    jsonschema.validate(body, schema)


async def test_a_401_is_problem_details_with_the_challenge(app: FastAPI) -> None:
    response = await call(app, "GET", "/v1/nodes")
    assert response.status_code == 401
    assert response.headers["content-type"] == PROBLEM
    assert response.headers["www-authenticate"] == 'Bearer realm="gpuloom"'
    assert set(response.json()) == {"type", "title", "status", "detail"}


@pytest.mark.parametrize(
    ("path", "allow"),
    [
        ("/v1/jobs", "GET, POST"),
        ("/v1/jobs/j1", "DELETE, GET"),
        ("/v1/nodes/n1/cordon", "DELETE, POST"),
    ],
    ids=["list and submit", "show and cancel", "cordon and uncordon"],
)
async def test_a_405_allows_every_method_of_the_path(app: FastAPI, path: str, allow: str) -> None:
    response = await call(app, "PATCH", path)
    assert response.status_code == 405
    assert response.headers["allow"] == allow
    assert response.headers["content-type"] == PROBLEM

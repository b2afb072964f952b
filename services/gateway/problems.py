"""Errors as RFC 9457 problem details, answered and documented in one place.

Every error the gateway answers is `application/problem+json`:
`{"type": "about:blank", "title": <status phrase>, "status": <code>, "detail": <why>}`,
and a 422 adds `errors`, one entry per bad field (`loc`, `msg`, `type`). A 405
names in `Allow` every method of the path, not only those of the first route
that matched it.

`add_problems` makes the OpenAPI document say so for every operation, from
what the route is, so that a route added later is covered without a word:
401 (with `WWW-Authenticate`) and 403 where a token is needed; 422 where the
request has parameters or a body; 413 where it has a body; 404 where the path
names something; 503 (with `Retry-After`) where the route reads the gateway's
projection or the log. What only one route answers (409, 502, the usage CSV) is
declared on its decorator (`responses=`), and its content made problem details here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.dependencies.models import Dependant
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import RouteContext, iter_route_contexts
from pydantic.json_schema import models_json_schema
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import compile_path

from services.gateway.auth import authenticate
from services.gateway.deps import STATEFUL
from services.gateway.schemas import Problem, ValidationProblem

MEDIA_TYPE = "application/problem+json"
#: What each status means, as the OpenAPI document says it.
MEANINGS: dict[int, str] = {
    400: "The body could not be read (it is not UTF-8 text)",
    401: "No valid bearer token: missing, malformed, expired or of another issuer",
    403: "The token's user may not do this (the detail says why)",
    404: "What the path names does not exist",
    409: "The request conflicts with the current state (the detail says which)",
    413: "The request body (or the event it makes) is too large",
    422: "A parameter or a field of the body is invalid (`errors` names each)",
    429: "Over a budget of the caller's (streams, replays): retry after Retry-After",
    502: "A node agent answered with an error",
    503: "The event log (NATS) is unreachable, or the gateway has not read it yet: "
    "retry after Retry-After",
}
_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": 'The challenge (RFC 6750): `Bearer realm="gpuloom"`, and '
            '`error="invalid_token"` with a description when a token came',
            "required": True,
            "schema": {"type": "string"},
        }
    },
    429: {
        "Retry-After": {
            "description": "Seconds to wait before retrying",
            "required": True,
            "schema": {"type": "string"},
        }
    },
    503: {
        "Retry-After": {
            "description": "Seconds to wait before retrying",
            "schema": {"type": "string"},
        }
    },
}
_FASTAPI_DESCRIPTIONS = {"Validation Error", "Additional Response", "Successful Response"}


def problem_body(status: int, detail: str) -> dict[str, Any]:
    """RFC 9457 problem details: `about:blank` and the status phrase as its title."""
    try:
        title = HTTPStatus(status).phrase
    except ValueError:
        title = "Error"
    body: dict[str, Any] = {
        "type": "about:blank",
        "title": title,
        "status": status,
        "detail": detail,
    }
    return {**body, "errors": []} if status == 422 else body


def problem_response(
    status: int, detail: str, headers: dict[str, str] | None = None, **extra: Any
) -> JSONResponse:
    return JSONResponse(
        {**problem_body(status, detail), **extra},
        status_code=status,
        headers=headers,
        media_type=MEDIA_TYPE,
    )


def add_problem_handlers(app: FastAPI) -> None:
    """Answer every HTTP error of `app`, and every invalid request, as problem details."""

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        """422 naming every bad field, e.g. `body.gpus: Input should be >= 0`."""
        errors = exc.errors()
        summary = "; ".join(
            f"{'.'.join(str(p) for p in err['loc'])}: {err['msg']}" for err in errors
        )
        return problem_response(422, summary, errors=[_plain(err) for err in errors])

    @app.exception_handler(StarletteHTTPException)
    async def problem(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        """Any HTTP error, `detail` as raised; a 405 with the path's whole `Allow`."""
        headers = dict(exc.headers or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(allowed_methods(app, request.url.path))
        return problem_response(exc.status_code, str(exc.detail), headers)


def allowed_methods(app: FastAPI, path: str) -> list[str]:
    """Every method some route of `app` answers at `path` (RFC 9110 `Allow`)."""
    methods: set[str] = set()
    for route in _routes(app):
        if route.path is not None and compile_path(route.path)[0].match(path):
            methods |= route.methods or set()
    return sorted(methods)


def _plain(error: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in error.items() if k in ("loc", "msg", "type")}


def _routes(app: FastAPI) -> Iterator[RouteContext]:
    return iter_route_contexts(app.routes)


# --- the OpenAPI document -----------------------------------------------------------------


def add_problems(doc: dict[str, Any], routes: Sequence[RouteContext]) -> dict[str, Any]:
    """`doc` with the error responses of each operation of `routes` as problem details."""
    components = doc.setdefault("components", {}).setdefault("schemas", {})
    _, defs = models_json_schema(
        [(Problem, "serialization"), (ValidationProblem, "serialization")],
        ref_template="#/components/schemas/{model}",
    )
    components.update(defs["$defs"])
    for route in routes:
        if not getattr(route, "include_in_schema", False) or route.path_format is None:
            continue
        dependant: Dependant | None = getattr(route, "dependant", None)
        for method in sorted((route.methods or set()) - {"HEAD"}):
            operation = doc["paths"].get(route.path_format, {}).get(method.lower())
            if operation is not None and dependant is not None:
                _document(operation, _statuses(operation, dependant))
    for unused in ("HTTPValidationError", "ValidationError"):
        components.pop(unused, None)
    return doc


def _statuses(operation: dict[str, Any], dependant: Dependant) -> set[int]:
    """The errors an operation can answer, from what its route depends on."""
    parameters = operation.get("parameters", [])
    statuses = {int(code) for code in operation.get("responses", {}) if int(code) >= 400}
    if _depends_on(dependant, lambda call: call is authenticate):  # all but the public ones
        statuses |= {401, 403}
    if parameters or "requestBody" in operation:
        statuses.add(422)
    if "requestBody" in operation:
        statuses |= {400, 413}
    if any(parameter["in"] == "path" for parameter in parameters):
        statuses.add(404)
    if 401 in statuses and _reads_gateway(dependant):  # /healthz never answers 503
        statuses.add(503)
    return statuses


def _document(operation: dict[str, Any], statuses: set[int]) -> None:
    responses = operation.setdefault("responses", {})
    for status in sorted(statuses):
        response = responses.setdefault(str(status), {})
        content = response.get("content", {})
        if content and not _is_problem(content):
            continue  # a route's own error body (/readyz's 503 is its readiness)
        schema = "ValidationProblem" if status == 422 else "Problem"
        response["content"] = {MEDIA_TYPE: {"schema": {"$ref": f"#/components/schemas/{schema}"}}}
        if response.get("description", "") in _FASTAPI_DESCRIPTIONS | {""}:
            response["description"] = MEANINGS.get(status, HTTPStatus(status).phrase)
        if status in _HEADERS:
            response["headers"] = dict(_HEADERS[status])


def _is_problem(content: dict[str, Any]) -> bool:
    """Whether a response's content is FastAPI's validation error or a Problem."""
    refs = {str(media.get("schema", {}).get("$ref", "")) for media in content.values()}
    return all(ref.rsplit("/", 1)[-1] in {"HTTPValidationError", "Problem"} for ref in refs)


def _depends_on(dependant: Dependant, found: Callable[[Any], bool]) -> bool:
    return any(found(sub.call) or _depends_on(sub, found) for sub in dependant.dependencies)


def _reads_gateway(dependant: Dependant) -> bool:
    """Whether the route itself (not only its token check) reads the gateway's state."""
    return any(
        sub.call in STATEFUL for sub in dependant.dependencies if sub.call is not authenticate
    )

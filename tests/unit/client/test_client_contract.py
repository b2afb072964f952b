"""The CLI reads only what the gateway answers: every `GpuloomClient` method's answer
type (a TypedDict of `gpuloom.client.schema`) is checked against the response schema
the gateway's OpenAPI document gives for the same method and path, key by key and
type by type, nested shapes included. A key the gateway renamed or dropped, or a
field that may now be null where the client expects a value, fails here rather than
in an operator's terminal."""

from __future__ import annotations

import ast
import inspect
import re
import types
import typing
from typing import Any, NotRequired, Required, TypedDict, get_args, get_origin, is_typeddict

import pytest

from gpuloom.client import api, schema
from gpuloom.config import Settings
from services.gateway.app import create_app

JSON_TYPES: dict[type, set[str]] = {
    str: {"string"},
    int: {"integer"},
    float: {"number", "integer"},
    bool: {"boolean"},
    type(None): {"null"},
}


def client_calls() -> list[tuple[str, str, str, type]]:
    """(method name, HTTP method, path template, answer type) of every client method
    that returns `cast(<TypedDict>, self._request("METHOD", path, ...))`."""
    tree = ast.parse(inspect.getsource(api))
    paths: dict[str, str] = {}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for inner in ast.walk(node):  # `path = f"..."` assignments name the path
            if (
                isinstance(inner, ast.Assign)
                and isinstance(inner.targets[0], ast.Name)
                and isinstance(inner.value, ast.JoinedStr | ast.Constant)
            ):
                paths[inner.targets[0].id] = _template(inner.value)
        for inner in ast.walk(node):
            if not (isinstance(inner, ast.Call) and getattr(inner.func, "id", "") == "cast"):
                continue
            kind, request = inner.args
            if not (
                isinstance(request, ast.Call) and getattr(request.func, "attr", "") == "_request"
            ):
                continue
            method, where = request.args[0], request.args[1]
            if not isinstance(method, ast.Constant) or not isinstance(kind, ast.Name):
                continue
            answer = getattr(schema, kind.id, None)
            if answer is None or not is_typeddict(answer):
                continue
            path = paths[where.id] if isinstance(where, ast.Name) else _template(where)
            found.append((node.name, method.value, path, answer))
    return found


def _template(value: ast.expr) -> str:
    """An f-string path as OpenAPI writes it: `/v1/jobs/{…}` for each placeholder."""
    if isinstance(value, ast.Constant):
        return str(value.value)
    assert isinstance(value, ast.JoinedStr)
    return "".join(
        str(part.value) if isinstance(part, ast.Constant) else "{}" for part in value.values
    )


CALLS = client_calls()


@pytest.fixture(scope="module")
def openapi(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("openapi")
    app = create_app(Settings(database_url=f"sqlite+aiosqlite:///{tmp}/gw.db", data_dir=tmp))
    document: dict[str, Any] = app.openapi()
    return document


def test_the_client_methods_are_found() -> None:
    names = {name for name, *_ in CALLS}
    assert {"get_job", "list_jobs", "queue", "explain", "accounts", "limits", "nodes"} <= names


@pytest.mark.parametrize(
    ("method", "verb", "path", "answer"), CALLS, ids=[call[0] for call in CALLS]
)
def test_each_answer_type_is_what_the_gateway_says_it_answers(
    openapi: dict[str, Any], method: str, verb: str, path: str, answer: type
) -> None:
    operation = _operation(openapi, verb, path)
    responses = operation["responses"]
    ok = next(code for code in sorted(responses) if code.startswith("2"))
    response = responses[ok]["content"]["application/json"]["schema"]
    problems = _compare(answer, response, openapi["components"]["schemas"], answer.__name__)
    assert problems == [], f"{method} ({verb} {path}): " + "; ".join(problems)


def _operation(openapi: dict[str, Any], verb: str, path: str) -> dict[str, Any]:
    pattern = re.escape(path).replace(r"\{\}", r"\{[^/]+\}")
    for template, item in openapi["paths"].items():
        if re.fullmatch(pattern, template) and verb.lower() in item:
            operation: dict[str, Any] = item[verb.lower()]
            return operation
    raise AssertionError(f"the gateway has no {verb} {path}")


def _compare(expected: Any, schema_: dict[str, Any], defs: dict[str, Any], where: str) -> list[str]:
    """What the client's type `expected` misses of what `schema_` lets the gateway send."""
    schema_ = _resolve(schema_, defs)
    if expected is Any:
        return []
    if is_typeddict(expected):
        return _compare_object(expected, schema_, defs, where)
    alternatives = schema_.get("anyOf") or schema_.get("oneOf")
    if alternatives:
        return [p for alt in alternatives for p in _compare(expected, alt, defs, where)]
    sent = schema_.get("type")
    if sent is None:
        return [f"{where}: the gateway's schema has no type, the client expects {expected}"]
    options = _options(expected)
    matching = [o for o in options if sent in _json_types(o)]
    if not matching:
        return [f"{where}: the gateway sends {sent}, the client expects {_show(expected)}"]
    if sent == "array":
        (item,) = get_args(matching[0]) or (Any,)
        return _compare(item, schema_.get("items", {}), defs, f"{where}[]")
    if sent == "object" and get_origin(matching[0]) is dict:
        _, value = get_args(matching[0])
        extra = schema_.get("additionalProperties", {})
        return _compare(value, extra if isinstance(extra, dict) else {}, defs, f"{where}{{}}")
    return []


def _compare_object(
    expected: Any, schema_: dict[str, Any], defs: dict[str, Any], where: str
) -> list[str]:
    if schema_.get("anyOf"):
        return [p for alt in schema_["anyOf"] for p in _compare(expected, alt, defs, where)]
    if schema_.get("type") != "object":
        return [f"{where}: the gateway sends {schema_.get('type')}, the client expects an object"]
    properties = schema_.get("properties", {})
    hints = typing.get_type_hints(expected, include_extras=True)
    problems = []
    for key, hint in hints.items():
        if key not in properties:
            problems.append(f"{where}.{key}: not in the gateway's answer")
            continue
        problems += _compare(_unwrap(hint), properties[key], defs, f"{where}.{key}")
    return problems


def _unwrap(hint: Any) -> Any:
    return get_args(hint)[0] if get_origin(hint) in (NotRequired, Required) else hint


def _options(expected: Any) -> list[Any]:
    if get_origin(expected) in (types.UnionType, typing.Union):
        return list(get_args(expected))
    return [expected]


def _json_types(option: Any) -> set[str]:
    origin = get_origin(option) or option
    if origin in (list, tuple):
        return {"array"}
    if origin is dict or is_typeddict(option):
        return {"object"}
    return JSON_TYPES.get(origin, {"string", "integer", "number", "boolean", "array", "object"})


def _resolve(schema_: dict[str, Any], defs: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema_:
        schema_ = defs[schema_["$ref"].rsplit("/", 1)[-1]]
    return schema_


def _show(expected: Any) -> str:
    return getattr(expected, "__name__", None) or str(expected)


# --- the check itself can fail -----------------------------------------------------------


class Renamed(TypedDict):
    id: str
    status: str  # the gateway says `state`


class NotNullable(TypedDict):
    id: str
    reason: str  # the gateway may send null


def test_a_renamed_or_not_nullable_key_is_caught(openapi: dict[str, Any]) -> None:
    response = _operation(openapi, "GET", "/v1/jobs/{}")["responses"]["200"]
    job = response["content"]["application/json"]["schema"]
    defs = openapi["components"]["schemas"]
    assert _compare(Renamed, job, defs, "Renamed") == [
        "Renamed.status: not in the gateway's answer"
    ]
    assert _compare(NotNullable, job, defs, "NotNullable") == [
        "NotNullable.reason: the gateway sends null, the client expects str"
    ]


def test_every_answer_type_of_the_schema_module_is_used() -> None:
    """A TypedDict no client method returns is checked only through another's fields."""
    used = {answer for *_, answer in CALLS}
    nested = {
        t
        for answer in used
        for hint in typing.get_type_hints(answer).values()
        for t in _flatten(hint)
        if is_typeddict(t)
    }
    declared = {
        value
        for name, value in vars(schema).items()
        if is_typeddict(value) and value.__module__ == schema.__name__
    }
    assert declared - used - nested - _nested_of(nested) == set()


def _flatten(hint: Any) -> list[Any]:
    args = get_args(hint)
    return [hint, *[t for arg in args for t in _flatten(arg)]] if args else [hint]


def _nested_of(found: set[Any]) -> set[Any]:
    more = {
        t
        for answer in found
        for hint in typing.get_type_hints(answer).values()
        for t in _flatten(hint)
        if is_typeddict(t)
    }
    return more if more <= found else more | _nested_of(more | found)

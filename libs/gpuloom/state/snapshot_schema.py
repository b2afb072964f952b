"""The shape of the folded state, and the pydantic-core codec derived from it.

Two things a snapshot needs from the model, both derived from `ClusterState`'s type
hints rather than from a hand-written field list, so that a field added later is
either carried by snapshots or makes a test fail, never silently dropped:

- `schema_fingerprint`: a hash of the model's shape (every dataclass's and pydantic
  model's field names, types and defaults, recursively, and each embedded event's
  schema `VERSION`). A snapshot written under another shape is refused, never misread
  (a snapshot leaves out fields equal to their default, so a default is shape too).
- `state_codec`: pydantic's validator and serializer of `ClusterState` (pydantic
  handles stdlib dataclasses), with three adjustments to its core schema so that the
  JSON round trip is exact and the bytes deterministic: dict keys that are tuples
  (JSON keys are strings) travel as the JSON text of their items; sets are written
  sorted. The state holds only what the log means (no caches: those live beside it,
  `gpuloom.state.changes`), so every field is carried.

Decoding is validation only: no code named by the data ever runs (no pickle).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import types
import typing
from copy import deepcopy
from datetime import datetime
from functools import cache
from typing import Annotated, Any, Literal, get_args, get_origin

from pydantic import BaseModel, TypeAdapter
from pydantic_core import PydanticUndefined, SchemaSerializer, SchemaValidator, core_schema

from gpuloom.state.model import ClusterState, JobState

#: Leaf types the codec carries as they are (JSON scalars, and datetimes with their zone).
LEAVES: tuple[type, ...] = (str, int, float, bool, type(None), datetime)


@cache
def schema_fingerprint() -> str:
    """The fingerprint of `ClusterState`, computed once per process."""
    return shape_fingerprint(ClusterState)


def shape_fingerprint(cls: type) -> str:
    """16 hex digits of sha256 over the canonical shape of dataclass `cls`.

    Stable across runs and processes: built from names sorted explicitly, never from
    `hash()` or set order. Raises TypeError for a field type the codec cannot vouch for.
    """
    shapes: dict[str, object] = {}
    root = _shape(cls, shapes)
    text = json.dumps({"root": root, "types": shapes}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _shape(tp: object, shapes: dict[str, object]) -> object:
    """A JSON-able description of type `tp`; named classes are described once in `shapes`."""
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        defaults = {f.name: _default(f.default, f.default_factory) for f in dataclasses.fields(tp)}
        return _class_shape(tp, _dataclass_fields(tp), {"defaults": defaults}, shapes)
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        hints: dict[str, object] = {n: f.annotation for n, f in tp.model_fields.items()}
        extra: dict[str, object] = {
            "defaults": {
                n: _default(f.default, f.default_factory) for n, f in tp.model_fields.items()
            }
        }
        version = getattr(tp, "VERSION", None)
        if version:
            extra["VERSION"] = version
        return _class_shape(tp, hints, extra, shapes)
    if tp in LEAVES:
        return _name(tp)
    if tp is Any:  # a JSON value (a policy's parameters): carried as JSON reads it back
        return "Any"
    origin, args = get_origin(tp), get_args(tp)
    if origin is Annotated:  # constraints are checked when read back, not fingerprinted
        return _shape(args[0], shapes)
    if origin is Literal:
        return {"Literal": sorted(repr(arg) for arg in args)}
    if origin in (typing.Union, types.UnionType):
        return {"Union": sorted((_shape(arg, shapes) for arg in args), key=json.dumps)}
    if origin in (dict, list, set, frozenset, tuple):
        return {origin.__name__: [_shape(arg, shapes) if arg is not ... else "..." for arg in args]}
    raise TypeError(f"snapshots cannot carry a field of type {tp!r}")


def _default(value: object, factory: object) -> str | None:
    """A field's default as fingerprinted: snapshots leave out a field equal to its
    default (`serialize_state`), so a changed default must refuse older snapshots rather
    than read them with the new one. None: the field has none (it is always written)."""
    if callable(factory):
        return f"factory {getattr(factory, '__qualname__', repr(factory))}"
    if value is dataclasses.MISSING or value is PydanticUndefined:
        return None
    return repr(value)


def _class_shape(
    cls: type, hints: dict[str, object], extra: dict[str, object], shapes: dict[str, object]
) -> str:
    name = _name(cls)
    if name not in shapes:
        shapes[name] = None  # recursion guard: a type may refer to itself
        fields = {field: _shape(hint, shapes) for field, hint in hints.items()}
        shapes[name] = {"fields": fields, **extra}
    return name


def _dataclass_fields(cls: type) -> dict[str, object]:
    """Resolved type hints of the dataclass's fields."""
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


class StateCodec(typing.NamedTuple):
    validator: SchemaValidator
    serializer: SchemaSerializer


@cache
def state_codec() -> StateCodec:
    """The validator and serializer of `ClusterState`, built once per process."""
    return codec_of(ClusterState)


@cache
def job_codec() -> StateCodec:
    """The same for one `JobState` (a record of the per-node view, `state.nodeview`)."""
    return codec_of(JobState)


def codec_of(cls: type) -> StateCodec:
    """The validator and serializer of dataclass `cls`, with the two adjustments."""
    adapter: TypeAdapter[Any] = TypeAdapter(cls)
    schema = deepcopy(adapter.core_schema)
    _adjust(schema)
    return StateCodec(SchemaValidator(schema), SchemaSerializer(schema))


def _adjust(node: Any) -> None:
    """Walk a core schema in place and apply the two adjustments (module docstring)."""
    if isinstance(node, list):
        for item in node:
            _adjust(item)
        return
    if not isinstance(node, dict):
        return
    kind = node.get("type")
    if kind == "dict" and node.get("keys_schema", {}).get("type") == "tuple":
        node["keys_schema"] = _tuple_key(node["keys_schema"])
    elif kind in ("set", "frozenset") and "serialization" not in node:
        node["serialization"] = core_schema.plain_serializer_function_ser_schema(
            sorted, return_schema=core_schema.list_schema(deepcopy(node.get("items_schema")))
        )
    for value in list(node.values()):
        _adjust(value)


def _tuple_key(schema: core_schema.CoreSchema) -> core_schema.CoreSchema:
    """A tuple key written as the JSON text of its items, read back through `schema`."""
    _adjust(schema)
    return core_schema.no_info_before_validator_function(
        _key_items,
        schema,
        serialization=core_schema.plain_serializer_function_ser_schema(
            _key_text, return_schema=core_schema.str_schema()
        ),
    )


def _key_text(key: tuple[object, ...]) -> str:
    return json.dumps(list(key), separators=(",", ":"))


def _key_items(text: object) -> object:
    """The tuple a key was written from; anything else is passed on for the tuple schema
    to refuse."""
    if isinstance(text, str):
        try:
            items = json.loads(text)
        except (ValueError, RecursionError):
            return text
        return tuple(items) if isinstance(items, list) else text
    return text

"""Which changes of the event schemas a log can live with: the contract's evolution rules.

The log is kept for months and read by every later version, and during a rolling
upgrade by older and newer processes at once. So, against the schemas published
before (`contracts/events.json`, written by `make contract`), a change is either

- *additive*: a new event type, or a new optional field in an existing payload at
  any depth (with its default). Older readers ignore the field (`codec.read_payload`),
  newer ones read old events with the default. The VERSION stays.
- *a new version*: anything else, i.e. a field removed, renamed, made required or
  given another type, pattern, bound or default. Old events then no longer read as
  they were written, and old readers would refuse new ones: the type's VERSION goes
  up and an upcaster (`upcasters.UPCASTERS`) brings each older version's payload to
  the new shape.

`breaking_changes` names every change that breaks these rules. Titles and
descriptions (docstrings) are not part of the contract.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from gpuloom.events.registry import json_schemas
from gpuloom.events.upcasters import UPCASTERS

#: Keys of a JSON Schema that document rather than constrain.
ANNOTATIONS = frozenset({"title", "description", "examples", "$comment"})

Schemas = Mapping[str, Any]


def dump() -> str:
    """The published schemas of every event type, as committed (`make contract`)."""
    return json.dumps(json_schemas(), indent=1, sort_keys=True) + "\n"


def breaking_changes(
    published: Schemas,
    current: Schemas,
    upcasters: Mapping[tuple[str, int], Callable[..., Any]] = UPCASTERS,
) -> list[str]:
    """Every change from `published` to `current` (both `json_schemas()`) that a log
    cannot live with; [] when each is additive or a new version with its upcasters."""
    problems: list[str] = []
    for name, before in sorted(published.items()):
        after = current.get(name)
        if after is None:
            problems.append(f"{name}: the type is gone, but logs hold it (keep the class)")
            continue
        if after["aggregate"] != before["aggregate"]:
            problems.append(f"{name}: aggregate {before['aggregate']} became {after['aggregate']}")
        old_v, new_v = before["v"], after["v"]
        if new_v < old_v:
            problems.append(f"{name}: VERSION went back from {old_v} to {new_v}")
        elif new_v > old_v:
            problems += [
                f"{name}: VERSION {new_v} without an upcaster from v{v} (upcasters.UPCASTERS)"
                for v in range(old_v, new_v)
                if (name, v) not in upcasters
            ]
        else:
            old_schema, new_schema = before["schema"], after["schema"]
            problems += [
                f"{name} v{old_v}: {change}; raise its VERSION and add an upcaster"
                for change in _changes(
                    old_schema, new_schema, old_schema.get("$defs", {}), new_schema.get("$defs", {})
                )
            ]
    return problems


def _changes(
    old: Any, new: Any, old_defs: Mapping[str, Any], new_defs: Mapping[str, Any], path: str = ""
) -> list[str]:
    """What changed from `old` to `new` other than optional properties added."""
    old, new = _resolve(old, old_defs), _resolve(new, new_defs)
    where = path or "the payload"
    if not isinstance(old, dict) or not isinstance(new, dict):
        return [] if old == new else [f"{where} changed"]
    problems: list[str] = []
    old_props, new_props = old.get("properties", {}), new.get("properties", {})
    for prop in sorted(old_props):
        if prop not in new_props:
            problems.append(f"{_join(path, prop)} removed")
    added_required = set(new.get("required", ())) - set(old.get("required", ()))
    problems += [f"{_join(path, prop)} is required now" for prop in sorted(added_required)]
    for prop in sorted(set(old_props) & set(new_props)):
        problems += _changes(
            old_props[prop], new_props[prop], old_defs, new_defs, _join(path, prop)
        )
    if _widened(old, new):  # more values allowed: every event already logged still is
        old = {k: v for k, v in old.items() if k not in ("const", "enum")}
        new = {k: v for k, v in new.items() if k not in ("const", "enum")}
    for key in sorted((set(old) | set(new)) - ANNOTATIONS - {"properties", "required", "$defs"}):
        if key not in old or key not in new:
            problems.append(f"{where}: `{key}` {'added' if key in new else 'removed'}")
        elif isinstance(old[key], dict | list) and _walkable(old[key], new[key]):
            problems += _nested(old[key], new[key], old_defs, new_defs, f"{where}.{key}")
        elif old[key] != new[key]:
            problems.append(f"{where}: `{key}` {old[key]!r} became {new[key]!r}")
    return problems


def _nested(
    old: Any, new: Any, old_defs: Mapping[str, Any], new_defs: Mapping[str, Any], path: str
) -> list[str]:
    """Changes within a sub-schema (`items`) or a list of them (`anyOf`)."""
    if isinstance(old, list):
        if len(old) != len(new):
            return [f"{path} has {len(new)} alternatives, had {len(old)}"]
        return [
            change
            for index, (a, b) in enumerate(zip(old, new, strict=True))
            for change in _changes(a, b, old_defs, new_defs, f"{path}[{index}]")
        ]
    return _changes(old, new, old_defs, new_defs, path)


def _widened(old: Mapping[str, Any], new: Mapping[str, Any]) -> bool:
    """A `const` or `enum` whose values the new `enum` all keeps (a Literal that took one
    more value): what the log holds is valid as before."""
    before = [old["const"]] if "const" in old else old.get("enum")
    after = new.get("enum")
    if before is None or after is None or "const" in new:
        return False
    return all(value in after for value in before)


def _walkable(old: Any, new: Any) -> bool:
    return type(old) is type(new) and (
        isinstance(old, list) or (isinstance(old, dict) and ("$ref" in old or "type" in old))
    )


def _resolve(schema: Any, defs: Mapping[str, Any]) -> Any:
    """`schema` with a local `$ref` (`#/$defs/Name`) replaced by its definition."""
    seen = 0
    while isinstance(schema, dict) and "$ref" in schema and seen < 32:
        name = str(schema["$ref"]).removeprefix("#/$defs/")
        rest = {k: v for k, v in schema.items() if k != "$ref"}
        schema = {**defs.get(name, {"$ref": name, "missing": True}), **rest}
        seen += 1
    return schema


def _join(path: str, prop: str) -> str:
    return f"{path}.{prop}" if path else prop

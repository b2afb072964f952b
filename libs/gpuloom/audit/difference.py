"""The first place two folded states differ, said in one line.

An audit that finds a snapshot unequal to the fold of the log has to say where, or
the operator has a 0.5 MB blob and the word "differs": this names the first field
that differs (`jobs['j1'].priority: 0 in the fold, 7 in the snapshot`). It walks
what dataclass equality compares, in the same way: dataclass fields in order,
pydantic models field by field, dicts and sets by key, lists and tuples by index.
Pure: it only reads its arguments.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import BaseModel

#: How much of a value a difference shows (a job's spec is kilobytes).
SHOWN = 80


def first_difference(fold: Any, snapshot: Any, path: str = "") -> str | None:
    """Where `fold` and `snapshot` first differ (`path: what`), or None when equal."""
    if fold == snapshot:
        return None
    where = path or "the state"
    if type(fold) is not type(snapshot):
        return (
            f"{where}: {type(fold).__name__} {_show(fold)} in the fold, "
            f"{type(snapshot).__name__} {_show(snapshot)} in the snapshot"
        )
    if dataclasses.is_dataclass(fold) and not isinstance(fold, type):
        for item in dataclasses.fields(fold):
            found = first_difference(
                getattr(fold, item.name), getattr(snapshot, item.name), _attr(path, item.name)
            )
            if found is not None:
                return found
    elif isinstance(fold, BaseModel):
        for name in type(fold).model_fields:
            found = first_difference(
                getattr(fold, name), getattr(snapshot, name), _attr(path, name)
            )
            if found is not None:
                return found
    elif isinstance(fold, dict):
        found = _dict_difference(fold, snapshot, path)
        if found is not None:
            return found
    elif isinstance(fold, (set, frozenset)):
        return _set_difference(fold, snapshot, where)
    elif isinstance(fold, (list, tuple)):
        for index, (ours, theirs) in enumerate(zip(fold, snapshot, strict=False)):
            found = first_difference(ours, theirs, f"{path}[{index}]")
            if found is not None:
                return found
        return f"{where}: {len(fold)} items in the fold, {len(snapshot)} in the snapshot"
    return f"{where}: {_show(fold)} in the fold, {_show(snapshot)} in the snapshot"


def _dict_difference(fold: dict[Any, Any], snapshot: dict[Any, Any], path: str) -> str | None:
    for key, value in fold.items():
        if key not in snapshot:
            return f"{path}[{_show(key)}]: in the fold, not in the snapshot"
        found = first_difference(value, snapshot[key], f"{path}[{_show(key)}]")
        if found is not None:
            return found
    for key in snapshot:
        if key not in fold:
            return f"{path}[{_show(key)}]: in the snapshot, not in the fold"
    return None


def _set_difference(fold: Any, snapshot: Any, where: str) -> str:
    only_fold = sorted(map(repr, fold - snapshot))[:3]
    only_snapshot = sorted(map(repr, snapshot - fold))[:3]
    parts = []
    if only_fold:
        parts.append(f"{', '.join(only_fold)} only in the fold")
    if only_snapshot:
        parts.append(f"{', '.join(only_snapshot)} only in the snapshot")
    return f"{where}: {'; '.join(parts)}"


def _attr(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


def _show(value: object) -> str:
    text = repr(value)
    return text if len(text) <= SHOWN else text[: SHOWN - 3] + "..."

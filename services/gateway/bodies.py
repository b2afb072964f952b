"""The base of every request body: JSON's types as the OpenAPI document states them.

Pydantic's lax mode turns `true` into 1 and `"5"` into 5 for an integer field, and 0,
1, `"yes"` or `"off"` into a boolean: a request that violates the schema the API
publishes would be taken, and `{"shares": false}` would set an account's shares to 0.
A body's number field takes JSON numbers only (an integral `5.0` stays valid, as JSON
Schema counts it an integer), and its boolean field `true` or `false` only, each
refused with a 422 naming the field. Only the fields' own values are checked here;
nested bodies are bodies too.
"""

from __future__ import annotations

import types
from collections.abc import Hashable
from functools import cache
from typing import Any, Union, cast, get_args, get_origin

from pydantic import BaseModel, ValidationInfo, field_validator

NUMBERS = (int, float)


@cache
def _kinds(annotation: Any) -> frozenset[type]:
    """The types a field's annotation admits, `None` left out (`int | None` -> {int})."""
    if get_origin(annotation) in (Union, types.UnionType):
        return frozenset(arg for arg in get_args(annotation) if arg is not type(None))
    return frozenset({annotation})


class Body(BaseModel):
    """A request body whose numbers and booleans are JSON's (module doc)."""

    @field_validator("*", mode="before")
    @classmethod
    def _json_scalars(cls, value: Any, info: ValidationInfo) -> Any:
        field = cls.model_fields.get(info.field_name or "")
        if field is None or field.annotation is None:
            return value
        kinds = _kinds(cast(Hashable, field.annotation))
        if kinds and kinds <= {*NUMBERS}:
            if isinstance(value, bool | str):
                raise ValueError("must be a number")
        elif kinds == {bool} and not isinstance(value, bool):
            raise ValueError("must be true or false")
        return value

"""A command's refusal as a value, and the one place it becomes an HTTP answer.

The gateway's commands (submit, cancel, the operators' writes) return what they did
or a `Refusal`: `Refused` (a status, why, and any headers: answered as problem
details) or `Invalid` (422 naming the fields at fault, as pydantic names them). The
command logic raises no HTTP error, so it can be tested without an application; the
route hands what it returns to `answer`, which raises the error FastAPI's handlers
(`problems.add_problem_handlers`) answer, with the same status, body and headers.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from fastapi import HTTPException
from fastapi.exceptions import RequestValidationError

T = TypeVar("T")

#: How long a client should wait before retrying a 503.
RETRY_AFTER = (("Retry-After", "2"),)


@dataclass(frozen=True)
class Refused:
    """The command is refused with `status` (403, 404, 409, 413, 503...) and `detail`."""

    status: int
    detail: str
    headers: tuple[tuple[str, str], ...] = ()

    def error(self) -> HTTPException:
        headers: Mapping[str, str] | None = dict(self.headers) if self.headers else None
        return HTTPException(status_code=self.status, detail=self.detail, headers=headers)


@dataclass(frozen=True)
class Invalid:
    """422: each entry names a field of the request at fault (`loc`, `msg`, `type`),
    `loc` starting where the request carries it (`body`, `header`, `path`)."""

    errors: tuple[dict[str, Any], ...]

    @classmethod
    def at(cls, loc: tuple[Any, ...], msg: str, type_: str = "value_error") -> Invalid:
        return cls(({"loc": loc, "msg": msg, "type": type_},))

    def under(self, *prefix: Any) -> Invalid:
        """The same errors with `prefix` after their first part (`body.jobs.3.gpus`)."""
        return Invalid(
            tuple({**e, "loc": (e["loc"][0], *prefix, *tuple(e["loc"])[1:])} for e in self.errors)
        )

    def error(self) -> RequestValidationError:
        return RequestValidationError(list(self.errors))


Refusal = Refused | Invalid


def denied(reason: str | None) -> Refused | None:
    """403 with `reason`, when the policy gave one (`gpuloom.auth.policy`'s answers)."""
    return Refused(403, reason) if reason is not None else None


def not_found(what: str) -> Refused:
    return Refused(404, f"{what} not found")


def unavailable(detail: str) -> Refused:
    """503 with Retry-After: the log, or the gateway's read of it, is not there yet."""
    return Refused(503, detail, RETRY_AFTER)


def answer(outcome: T | Refusal) -> T:
    """`outcome`, or the HTTP error of a refusal raised (problem details, same status,
    detail and headers as the command said)."""
    if isinstance(outcome, Refused | Invalid):
        raise outcome.error()
    return outcome

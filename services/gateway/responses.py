"""The error answers routes declare in the OpenAPI contract, beside 2xx and 422, named
once for every route module that may give them."""

from __future__ import annotations

from typing import Any

from services.gateway.schemas import Problem

UNAVAILABLE: dict[int | str, dict[str, Any]] = {
    503: {"model": Problem, "description": "NATS unreachable; retry after Retry-After"}
}
#: What a submission may answer besides 202 and 422 (one job, an array, or a batch).
SUBMIT_RESPONSES: dict[int | str, dict[str, Any]] = {
    **UNAVAILABLE,
    403: {"model": Problem},
    409: {"model": Problem},
    413: {"model": Problem},
}

"""/v1/usage (like `sreport`) and /v1/usage/jobs (like `sacct`), as JSON or CSV.

Each caller sees the charges they may read (`gpuloom.auth.policy.usage_scope`): an
operator all of them; anyone else their own and those of the accounts they
coordinate (and below)."""

from __future__ import annotations

import csv
import io
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BeforeValidator

from gpuloom.auth.policy import usage_scope
from services.gateway.auth import PrincipalDep
from services.gateway.deps import ReadsDep
from services.gateway.schemas import Usage, UsageRecord, UsageRecords

router = APIRouter(tags=["usage"])


def _not_a_number(value: object) -> object:
    """Refuse `0.5`, which pydantic would read as seconds since 1970: the schema says
    a date-time (422 naming the parameter)."""
    try:
        float(str(value))
    except ValueError:
        return value
    raise ValueError("must be an ISO 8601 time (2026-01-01T00:00:00Z), not a number")


_TIME = BeforeValidator(_not_a_number)
Since = Annotated[datetime | None, _TIME, Query(description="charges at or after (ISO 8601)")]
Until = Annotated[datetime | None, _TIME, Query(description="charges before (ISO 8601)")]
Format = Annotated[Literal["json", "csv"], Query(description="json, or csv for spreadsheets")]
#: The answer with `format=csv`: a header row, then one row per line of the report.
CSV: dict[str, Any] = {
    "description": "The report: JSON, or with `format=csv` a CSV file (a header row first)",
    "content": {"text/csv": {"schema": {"type": "string"}}},
}


def _csv(header: list[str], rows: list[list[object]], name: str) -> Response:
    buffer = io.StringIO()
    writer = csv.writer(buffer)
    writer.writerow(header)
    writer.writerows(rows)
    return Response(
        buffer.getvalue(),
        media_type="text/csv",
        headers={"Content-Disposition": f'attachment; filename="{name}.csv"'},
    )


@router.get("/v1/usage", response_model=Usage, responses={200: CSV})
async def usage(
    reads: ReadsDep,
    principal: PrincipalDep,
    since: Since = None,
    until: Until = None,
    group_by: Annotated[
        Literal["account", "user", "gpu_model"], Query(description="the rows of the CSV")
    ] = "account",
    format: Format = "json",
) -> Any:
    """GPU time charged per account, per user and per GPU model (from the accounting ledger)."""
    scope = usage_scope(principal, reads.accounts())
    report = await reads.usage.report(scope, since, until)
    if format == "json":
        if until is not None:
            return report  # a window that ends: charged time only
        now = datetime.now(UTC)  # the running runs' use is read at the gateway's clock
        running = reads.usage.running(scope, now)
        if not running:
            return report  # nothing runs: the answer is the ledger's alone, read twice alike
        return report.model_copy(update={"running": running, "as_of": now})
    if group_by == "account":
        rows = [[r.account, r.gpu_seconds, r.gpu_seconds / 3600, r.jobs] for r in report.accounts]
        return _csv(["account", "gpu_seconds", "gpu_hours", "jobs"], rows, "usage-by-account")
    if group_by == "user":
        rows = [
            [r.user, r.account, r.gpu_seconds, r.gpu_seconds / 3600, r.jobs] for r in report.users
        ]
        return _csv(["user", "account", "gpu_seconds", "gpu_hours", "jobs"], rows, "usage-by-user")
    rows = [[r.gpu_model, r.gpu_seconds, r.gpu_seconds / 3600, r.jobs] for r in report.gpu_models]
    return _csv(["gpu_model", "gpu_seconds", "gpu_hours", "jobs"], rows, "usage-by-gpu-model")


@router.get("/v1/usage/jobs", response_model=UsageRecords, responses={200: CSV})
async def usage_records(
    reads: ReadsDep,
    principal: PrincipalDep,
    since: Since = None,
    until: Until = None,
    user: str | None = None,
    account: str | None = None,
    limit: Annotated[int, Query(ge=1, le=100_000)] = 10_000,
    format: Format = "json",
) -> Any:
    """One record per charged run of a job (its parts added up), oldest first.

    A run still going has its interim charges so far; `charged_at` is the latest.
    """
    scope = usage_scope(principal, reads.accounts())
    records = await reads.usage.records(scope, since, until, user, account, limit)
    if format == "json":
        return UsageRecords(records=records)
    header = [name for name in UsageRecord.model_fields if name != "gpu_models"]
    return _csv(
        header,
        [[getattr(r, name) for name in header] for r in records],
        "usage-records",
    )

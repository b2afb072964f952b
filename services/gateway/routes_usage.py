"""/v1/usage (like `sreport`) and /v1/usage/jobs (like `sacct`), as JSON or CSV.

Each caller sees the charges they may read (`gpuloom.auth.policy.usage_scope`): an
operator all of them; anyone else their own and those of the accounts they
coordinate (and below)."""

from __future__ import annotations

import csv
import io
from datetime import datetime
from typing import Annotated, Any, Literal, TypeVar, cast

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BeforeValidator
from sqlalchemy import ColumnElement, false, func, or_, select

from gpuloom.auth.policy import Scope, usage_scope
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.store.models import UsageChargeRow, UsageModelChargeRow
from services.gateway.auth import PrincipalDep, accounts_of
from services.gateway.deps import GatewayDep, SessionDep
from services.gateway.schemas import (
    AccountUsage,
    ModelUsage,
    Usage,
    UsageRecord,
    UsageRecords,
    UserUsage,
)

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


Q = TypeVar("Q")


def _window(query: Q, column: Any, since: datetime | None, until: datetime | None) -> Q:
    """`query` restricted to charges in [since, until)."""
    restricted: Any = query
    if since is not None:
        restricted = restricted.where(column >= since)
    if until is not None:
        restricted = restricted.where(column < until)
    return cast(Q, restricted)


def _visible(scope: Scope | None, user: Any, account: Any) -> ColumnElement[bool] | None:
    """The condition on a ledger's rows that `scope` may read (None: every row)."""
    if scope is None:
        return None
    accounts = sorted(scope.accounts)
    return or_(user == scope.user, account.in_(accounts) if accounts else false())


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
    session: SessionDep,
    gateway: GatewayDep,
    principal: PrincipalDep,
    since: Since = None,
    until: Until = None,
    group_by: Annotated[
        Literal["account", "user", "gpu_model"], Query(description="the rows of the CSV")
    ] = "account",
    format: Format = "json",
) -> Any:
    """GPU time charged per account, per user and per GPU model (from the accounting ledger)."""
    charges, by_model = UsageChargeRow, UsageModelChargeRow
    scope = usage_scope(principal, accounts_of(gateway))
    mine = _visible(scope, charges.user, charges.account)
    mine_by_model = _visible(scope, by_model.user, by_model.account)
    gpu_ms = func.sum(charges.gpu_milli_seconds)
    jobs = func.count(func.distinct(charges.job_id))
    by_account = _window(select(charges.account, gpu_ms, jobs), charges.charged_at, since, until)
    by_user = _window(
        select(charges.user, charges.account, gpu_ms, jobs), charges.charged_at, since, until
    )
    per_model = _window(
        select(
            by_model.gpu_model,
            func.sum(by_model.gpu_milli_seconds),
            func.count(func.distinct(by_model.job_id)),
        ),
        by_model.charged_at,
        since,
        until,
    )
    if mine is not None and mine_by_model is not None:
        by_account, by_user = by_account.where(mine), by_user.where(mine)
        per_model = per_model.where(mine_by_model)
    accounts = await session.execute(by_account.group_by(charges.account).order_by(charges.account))
    users = await session.execute(
        by_user.group_by(charges.user, charges.account).order_by(charges.user, charges.account)
    )
    models = await session.execute(
        per_model.group_by(by_model.gpu_model).order_by(by_model.gpu_model)
    )
    report = Usage(
        since=since,
        until=until,
        accounts=[
            AccountUsage(account=a, gpu_seconds=ms / MILLI_PER_GPU, jobs=n) for a, ms, n in accounts
        ],
        users=[
            UserUsage(user=u, account=a, gpu_seconds=ms / MILLI_PER_GPU, jobs=n)
            for u, a, ms, n in users
        ],
        gpu_models=[
            ModelUsage(gpu_model=m, gpu_seconds=ms / MILLI_PER_GPU, jobs=n) for m, ms, n in models
        ],
    )
    if format == "json":
        return report
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
    session: SessionDep,
    gateway: GatewayDep,
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
    query = _window(select(UsageChargeRow), UsageChargeRow.charged_at, since, until)
    mine = _visible(
        usage_scope(principal, accounts_of(gateway)), UsageChargeRow.user, UsageChargeRow.account
    )
    if mine is not None:
        query = query.where(mine)
    if user:
        query = query.where(UsageChargeRow.user == user)
    if account:
        query = query.where(UsageChargeRow.account == account)
    rows = await session.scalars(query.order_by(UsageChargeRow.seq))
    runs: dict[tuple[str, int], UsageRecord] = {}
    for r in rows:
        key = (r.job_id, r.attempt)
        seen = runs.get(key)
        if seen is None:
            if len(runs) >= limit:
                continue
            runs[key] = UsageRecord(
                job_id=r.job_id,
                attempt=r.attempt,
                user=r.user,
                account=r.account,
                gpus=r.gpus,
                seconds=r.seconds,
                gpu_seconds=r.gpu_milli_seconds / MILLI_PER_GPU,
                charged_at=r.charged_at,
            )
        else:
            runs[key] = seen.model_copy(
                update={
                    "seconds": seen.seconds + r.seconds,
                    "gpu_seconds": seen.gpu_seconds + r.gpu_milli_seconds / MILLI_PER_GPU,
                    "charged_at": r.charged_at,
                }
            )
    models = await _models_of_runs(session, list(runs), since, until)
    records = [
        record.model_copy(update={"gpu_models": models.get(key, {})}) if key in models else record
        for key, record in runs.items()
    ]
    if format == "json":
        return UsageRecords(records=records)
    header = [name for name in UsageRecord.model_fields if name != "gpu_models"]
    return _csv(
        header,
        [[getattr(r, name) for name in header] for r in records],
        "usage-records",
    )


async def _models_of_runs(
    session: Any, runs: list[tuple[str, int]], since: datetime | None, until: datetime | None
) -> dict[tuple[str, int], dict[str, float]]:
    """The GPU seconds of each run by GPU model, from the ledger split by model."""
    found: dict[tuple[str, int], dict[str, float]] = {}
    jobs = sorted({job_id for job_id, _ in runs})
    wanted = set(runs)
    for start in range(0, len(jobs), 500):  # IN lists of a size every database takes
        query = _window(
            select(
                UsageModelChargeRow.job_id,
                UsageModelChargeRow.attempt,
                UsageModelChargeRow.gpu_model,
                func.sum(UsageModelChargeRow.gpu_milli_seconds),
            ),
            UsageModelChargeRow.charged_at,
            since,
            until,
        ).where(UsageModelChargeRow.job_id.in_(jobs[start : start + 500]))
        query = query.group_by(
            UsageModelChargeRow.job_id, UsageModelChargeRow.attempt, UsageModelChargeRow.gpu_model
        )
        for job_id, attempt, model, milli in (await session.execute(query)).tuples():
            if (job_id, attempt) in wanted:
                found.setdefault((job_id, attempt), {})[model] = int(milli or 0) / MILLI_PER_GPU
    return found

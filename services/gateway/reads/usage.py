"""Reads of the accounting ledger (`usage_charges`, `usage_model_charges`): GPU time per
account, user and GPU model (`GET /v1/usage`, like `sreport`), and per charged run of
a job (`GET /v1/usage/jobs`, like `sacct`), limited to the charges a scope may read
(`gpuloom.auth.policy.usage_scope`; None: every charge)."""

from __future__ import annotations

from datetime import datetime
from typing import Any, TypeVar, cast

from sqlalchemy import ColumnElement, false, func, or_, select

from gpuloom.auth.policy import Scope
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.state import ClusterState
from gpuloom.store.models import UsageChargeRow, UsageModelChargeRow
from services.gateway.reads.source import Source
from services.gateway.schemas import (
    AccountUsage,
    ModelUsage,
    RunningUsage,
    Usage,
    UsageRecord,
    UserUsage,
)

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


class UsageReads:
    __slots__ = ("_source",)

    def __init__(self, source: Source) -> None:
        self._source = source

    def running(self, scope: Scope | None, now: datetime) -> list[RunningUsage]:
        """What runs going on have used since their last charge, as of `now` (the fold's
        runs: nothing before the gateway read the log)."""
        state = self._source.folded()
        return [] if state is None else running_usage(state, scope, now)

    async def report(
        self, scope: Scope | None, since: datetime | None, until: datetime | None
    ) -> Usage:
        """GPU time charged in [since, until) per account, per user and per GPU model."""
        charges, by_model = UsageChargeRow, UsageModelChargeRow
        mine = _visible(scope, charges.user, charges.account)
        mine_by_model = _visible(scope, by_model.user, by_model.account)
        gpu_ms = func.sum(charges.gpu_milli_seconds)
        jobs = func.count(func.distinct(charges.job_id))
        by_account = _window(
            select(charges.account, gpu_ms, jobs), charges.charged_at, since, until
        )
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
        async with self._source.session() as session:
            accounts = await session.execute(
                by_account.group_by(charges.account).order_by(charges.account)
            )
            users = await session.execute(
                by_user.group_by(charges.user, charges.account).order_by(
                    charges.user, charges.account
                )
            )
            models = await session.execute(
                per_model.group_by(by_model.gpu_model).order_by(by_model.gpu_model)
            )
        return Usage(
            since=since,
            until=until,
            accounts=[
                AccountUsage(account=a, gpu_seconds=ms / MILLI_PER_GPU, jobs=n)
                for a, ms, n in accounts
            ],
            users=[
                UserUsage(user=u, account=a, gpu_seconds=ms / MILLI_PER_GPU, jobs=n)
                for u, a, ms, n in users
            ],
            gpu_models=[
                ModelUsage(gpu_model=m, gpu_seconds=ms / MILLI_PER_GPU, jobs=n)
                for m, ms, n in models
            ],
        )

    async def records(
        self,
        scope: Scope | None,
        since: datetime | None,
        until: datetime | None,
        user: str | None,
        account: str | None,
        limit: int,
    ) -> list[UsageRecord]:
        """One record per charged run of a job (its parts added up), oldest first, at
        most `limit`; a run still going has its interim charges so far."""
        query = _window(select(UsageChargeRow), UsageChargeRow.charged_at, since, until)
        mine = _visible(scope, UsageChargeRow.user, UsageChargeRow.account)
        if mine is not None:
            query = query.where(mine)
        if user:
            query = query.where(UsageChargeRow.user == user)
        if account:
            query = query.where(UsageChargeRow.account == account)
        async with self._source.session() as session:
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
        return [
            record.model_copy(update={"gpu_models": models.get(key, {})})
            if key in models
            else record
            for key, record in runs.items()
        ]


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


def running_usage(state: ClusterState, scope: Scope | None, now: datetime) -> list[RunningUsage]:
    """Per user and account, the GPU time of their runs going on from each run's last
    charge (or its start) to `now`, and how many jobs: what the usage view shows beside
    the charged time, so that four busy GPUs do not read as zero until the next charge."""
    milli_seconds: dict[tuple[str, str], float] = {}
    jobs: dict[tuple[str, str], set[str]] = {}
    for job_ids in state.on_node.values():
        for job_id in job_ids:
            job = state.jobs.get(job_id)
            run = job.current_run() if job is not None else None
            if job is None or run is None or run.ended_at is not None:
                continue
            key = (job.spec.user, job.spec.account)
            if scope is not None and not scope.covers(*key):
                continue
            counted = jobs.setdefault(key, set())
            if job_id in counted:
                continue  # a gang is on several nodes: once
            counted.add(job_id)
            since = run.charged_until or run.started_at
            seconds = max(0.0, (now - since).total_seconds())
            milli_seconds[key] = milli_seconds.get(key, 0.0) + run.gpu_milli * seconds
    return [
        RunningUsage(
            user=user,
            account=account,
            gpu_seconds=ms / MILLI_PER_GPU,
            jobs=len(jobs[(user, account)]),
        )
        for (user, account), ms in sorted(milli_seconds.items())
    ]

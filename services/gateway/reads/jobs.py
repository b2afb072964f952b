"""Reads of jobs: the rows of `GET /v1/jobs` and `GET /v1/jobs/{id}` (a job array's
tasks included), each pending job's reason and explanation from the gateway's fold,
and who owns a job (its audit trail's visibility)."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import func, select

from gpuloom.auth import Principal
from gpuloom.auth.policy import Accounts, job_problem
from gpuloom.decide.explain import Shared, explain, reason_text
from gpuloom.state import PENDING_PHASES, ClusterState
from gpuloom.state.retention import owner
from gpuloom.store.models import JobRow
from services.gateway.reads.arrays import array_state
from services.gateway.reads.source import NOT_READ, Source
from services.gateway.refusals import Refused, not_found, unavailable
from services.gateway.schemas import Job, JobExplanation, JobList

Owner = tuple[str, str]


@dataclass(frozen=True, slots=True)
class Standing:
    """Whose a job (or a job array) is and where it stands: what cancelling checks."""

    user: str
    account: str
    state: str


@dataclass(frozen=True, slots=True)
class Trail:
    """Who owns a job, as far as the fold or the rows know (None: nobody knows), and
    the aggregates whose events make its audit trail (its array's first)."""

    owner: Owner | None
    aggregates: list[str]


def _job(row: JobRow) -> Job:
    return Job.model_validate(row, from_attributes=True)


class JobReads:
    __slots__ = ("_source",)

    def __init__(self, source: Source) -> None:
        self._source = source

    def shown_to(self, job: Job, principal: Principal, accounts: Accounts | None = None) -> Job:
        """The job as `principal` may see it: its command hidden unless the policy allows."""
        if accounts is None:
            accounts = self._source.accounts()
        if job_problem(principal, "details", job.user, job.account, accounts) is not None:
            job = job.model_copy(update={"command": None})
        return job

    async def page(
        self,
        principal: Principal,
        state: str | None,
        user: str | None,
        account: str | None,
        limit: int,
        offset: int,
        newest: bool = False,
    ) -> JobList:
        """One page of jobs in submission order (`newest`: the latest first, as squeue and
        kubectl users look for the job they just submitted), as `principal` may see them,
        each pending one with its reason; `total`: every job the filters match."""
        query = select(JobRow)
        if state:
            query = query.where(JobRow.state == state)
        if user:
            query = query.where(JobRow.user == user)
        if account:
            query = query.where(JobRow.account == account)
        async with self._source.session() as session:
            total = await session.scalar(select(func.count()).select_from(query.subquery())) or 0
            order = (
                (JobRow.submit_seq.desc(), JobRow.id.desc())
                if newest
                else (JobRow.submit_seq, JobRow.id)
            )
            rows = await session.scalars(query.order_by(*order).limit(limit).offset(offset))
            accounts = self._source.accounts()
            listed = [self.shown_to(_job(row), principal, accounts) for row in rows]
        pending = [job.id for job in listed if job.state in PENDING_PHASES]
        shared = self._source.explainer(pending) if pending else None
        return JobList(jobs=[self.with_reason(job, shared) for job in listed], total=total)

    def with_reason(self, job: Job, shared: Shared | None = None) -> Job:
        """A pending job with its explain code and detail as `reason` (squeue's REASON:
        `Resources: no node has room for it now`), what the row said kept after it.
        `shared`: what explaining the other jobs of a list computed already."""
        state = self._source.folded()
        live = state.jobs.get(job.id) if state is not None else None
        # The rows are written a batch after the fold: explain only the state the row
        # shows, lest a row still `submitted` carry the reason of the job already queued.
        if state is None or live is None or live.phase != job.state:
            return job
        if job.state not in PENDING_PHASES:
            return job
        if shared is None:
            shared = self._source.explainer([job.id])
        found = explain(state, job.id, brief=True, shared=shared)
        if found is None or found.reason is None:
            return job
        reason = reason_text(found.reason, found.detail) or ""
        if job.reason and job.reason not in reason:  # e.g. "requeued: node-b lost"
            reason += f" ({job.reason})"
        return job.model_copy(update={"reason": reason})

    async def lookup(self, job_id: str) -> Job | list[Job] | Refused:
        """The job's row; else the rows of the job array's tasks, by index ([]: no job
        and no array); refused (503) then, before the gateway read the log.

        The task ids come from the folded state, not from a range or LIKE on the id
        column: a PostgreSQL collation such as en_US does not sort `-` and `.` bytewise.
        """
        found = await self._rows(job_id)
        if isinstance(found, JobRow):
            return _job(found)
        return found if isinstance(found, Refused) else [_job(row) for row in found]

    async def standing(self, job_id: str) -> Standing | Refused:
        """Whose the job (or array) is and its state (an array's: its tasks' as one);
        refused 404 when there is neither, 503 as `lookup`."""
        found = await self._rows(job_id)
        if isinstance(found, Refused):
            return found
        if isinstance(found, JobRow):
            return Standing(found.user, found.account, found.state)
        if not found:
            return not_found(f"job {job_id}")
        return Standing(found[0].user, found[0].account, array_state([t.state for t in found]))

    async def _rows(self, job_id: str) -> JobRow | list[JobRow] | Refused:
        async with self._source.session() as session:
            row: JobRow | None = await session.get(JobRow, job_id)
            if row is not None:
                return row
            state = self._source.folded()
            if state is None:
                return unavailable(NOT_READ)
            tasks = state.array_tasks(job_id)
            if not tasks:
                return []
            rows = {
                row.id: row
                for row in await session.scalars(select(JobRow).where(JobRow.id.in_(tasks)))
            }
        return [rows[task] for task in tasks if task in rows]

    async def row(self, job_id: str) -> Job | None:
        """The job as its row says (its command included), or None."""
        async with self._source.session() as session:
            row = await session.get(JobRow, job_id)
            return _job(row) if row is not None else None

    async def explanation(self, job_id: str) -> JobExplanation | Refused:
        """Why the job is pending (`gpuloom.decide.explain` on the fold); a job that has
        left the live state answers from its row; refused 404, or 503 before the
        gateway read the log."""
        state = self._source.fold()
        if isinstance(state, Refused):
            return state
        found = explain(state, job_id, shared=self._source.explainer([job_id]))
        if found is None or job_id not in state.jobs:
            row = await self.row(job_id)
            if row is not None:
                return JobExplanation(id=job_id, state=row.state, reason=None, detail=row.reason)
        if found is None:
            return not_found(f"job {job_id}")
        return JobExplanation(
            id=found.job_id,
            state=found.state,
            reason=found.reason,
            detail=found.detail,
            position=found.position,
            ahead=found.ahead,
            nodes=found.nodes,
            estimated_start=found.estimated_start,
        )

    async def trail(self, job_id: str) -> Trail | Refused:
        """Who owns the job and whose events make its trail (a task of a job array
        starts with its array's); refused (503) before the gateway read the log."""
        state = self._source.fold()
        if isinstance(state, Refused):
            return state
        aggregates = [job_id]
        job = state.jobs.get(job_id)
        ended = state.tombstones.get(job_id)  # ended and forgotten by the fold (retention.py)
        if job is None and job_id in state.arrays:
            owned = first_owner(state.array_tasks(job_id), state)
        else:
            owned = owner(state, job_id)
            array_id = job.array_id if job is not None else ended.array_id if ended else None
            if array_id is not None:
                aggregates.insert(0, array_id)
        if owned is None:  # ended longer ago than the fold remembers: the rows know
            row = await self.row(job_id)
            owned = (row.user, row.account) if row is not None else None
        return Trail(owned, aggregates)


def first_owner(tasks: list[str], state: ClusterState) -> Owner | None:
    """The owner of the first of `tasks` the fold still knows: an array's tasks may
    have left the fold at different times."""
    return next((found for task in tasks if (found := owner(state, task)) is not None), None)

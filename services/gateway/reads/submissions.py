"""What a submission checks on the gateway's fold before it is written (`jobs.submitting`,
`jobs.submit_policy`): its priority class, the limits it would pass, whether some node
could ever run it, the advance reservation it names, and the job an earlier request
with its idempotency key made.

Before the gateway read the log each judges on an empty state (the built-in class
only, no limits set, no node), or not at all; admission checks the same on the log."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from gpuloom.decide.admission import reservation_use_problem, resources_problem
from gpuloom.events import JobSpec
from gpuloom.queueing.classes import class_named, classes, default_class
from gpuloom.queueing.limits import active_counts, identities, submit_limit_problem
from gpuloom.state.retention import final_phase, owner
from gpuloom.state.tenancy import PriorityClass
from services.gateway.reads.jobs import Owner, first_owner
from services.gateway.reads.source import Source


@dataclass(frozen=True, slots=True)
class Keyed:
    """The job an idempotency key made: its owner (None: forgotten), its tasks (a job
    array's, else None) and the phase the fold last knew (None: unknown)."""

    job_id: str
    owner: Owner | None
    tasks: list[str] | None
    phase: str | None


class SubmissionReads:
    __slots__ = ("_source",)

    def __init__(self, source: Source) -> None:
        self._source = source

    def priority_class(self, name: str | None) -> PriorityClass | None:
        """The class `name` (None: the default class), or None if there is none."""
        state = self._source.fold_or_empty()
        return default_class(state) if name is None else class_named(state, name)

    def class_names(self) -> list[str]:
        """The names of every class a job may name, in order."""
        return [known.name for known in classes(self._source.fold_or_empty())]

    def limits_set_for(self, applying: Iterable[tuple[str, str]]) -> bool:
        """Whether an operator set limits for any of `applying` (scope, name)."""
        return not set(applying).isdisjoint(self._source.fold_or_empty().limits)

    def over_limit(self, specs: Sequence[JobSpec]) -> tuple[int, str] | None:
        """The first of `specs` that would pass a `max_submit_jobs` or `max_array_size`
        of its user, its account or the cluster (`gpuloom.queueing.limits`), each
        counting those before it, and why; None when none would."""
        state = self._source.fold_or_empty()
        counts = active_counts(state, with_submitted=True)
        for number, spec in enumerate(specs):
            adding = spec.array or 1
            problem = submit_limit_problem(
                state, spec.user, spec.account, adding, spec.array, counts
            )
            if problem is not None:
                return number, problem
            for identity in identities(spec):
                counts[identity] += adding
        return None

    def infeasible(self, spec: JobSpec) -> tuple[str | None, str] | None:
        """The field at fault and why no registered node could ever run `spec`
        (`resources_problem`, remembered by request shape: `parts.Feasibility`).

        None while the gateway still reads the log at its start, or while no node is
        registered yet (a stack starting: its agents come a moment later): admission
        alone judges then (it rejects such a job with the reason)."""
        gateway = self._source.gateway
        state = self._source.folded()
        if state is None or state.seq < gateway.start_seq or not state.nodes:
            return None
        return gateway.feasibility.answer(state, spec, resources_problem)

    def reservation_problem(self, spec: JobSpec) -> str | None:
        """Why `spec` may not run in the advance reservation it names
        (`reservation_use_problem`: none of that name, a maintenance window, one that does
        not let its user or account in, fewer GPUs than it asks). None when it names none,
        or while the gateway still reads the log at its start: admission judges then."""
        if spec.reservation is None:
            return None
        state = self._source.folded()
        if state is None or state.seq < self._source.gateway.start_seq:
            return None
        return reservation_use_problem(state, spec)

    def keyed(self, key: str) -> Keyed | None:
        """The job an idempotency key made, as the fold remembers it (None: no such
        key, or the gateway has not read the log yet)."""
        state = self._source.folded()
        if state is None:
            return None
        job_id = state.idempotency_keys.get(key)
        if job_id is None:
            return None
        if job_id in state.arrays:
            tasks = state.array_tasks(job_id)
            return Keyed(job_id, first_owner(tasks, state), tasks, None)
        return Keyed(job_id, owner(state, job_id), None, final_phase(state, job_id))

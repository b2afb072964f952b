"""Priority classes and per-identity limits, as pure readings of the folded state.

The gateway asks these before it publishes a submission (a clear 403 at once), and
admission asks them again on the log, in submission order, which is what holds:
two submissions may both pass a gateway that has not folded the other yet, and
admission then rejects the one over the limit, with the same words.

Classes: a job names one (`JobSpec.priority_class`); None is a submission from
before classes, which keeps its priority and may preempt as it always could. A
submission naming none gets the default class: the one marked `default`, else
`normal`, an operator's class of that name or the built-in one (priority 0, may
preempt, open to everyone).
"""

from __future__ import annotations

from collections import Counter

from gpuloom.events import JobSpec
from gpuloom.events.policies import BUILTIN_CLASS
from gpuloom.state import ClusterState, JobState
from gpuloom.state.model import IdentityLimits, PriorityClass

#: The class a cluster has before an operator defines any.
BUILTIN = PriorityClass(
    name=BUILTIN_CLASS,
    priority=0,
    may_preempt=True,
    description="built in: the class of every submission while no class is the default",
)


def class_named(state: ClusterState, name: str) -> PriorityClass | None:
    """The class `name`: an operator's, else the built-in `normal`; None if unknown."""
    known = state.priority_classes.get(name)
    if known is not None:
        return known
    return BUILTIN if name == BUILTIN_CLASS else None


def default_class(state: ClusterState) -> PriorityClass:
    """The class of a submission that names none (the fold keeps at most one default)."""
    for _, known in sorted(state.priority_classes.items()):
        if known.default:
            return known
    return class_named(state, BUILTIN_CLASS) or BUILTIN


def classes(state: ClusterState) -> list[PriorityClass]:
    """Every class a job may name, by name: the operators' and, unless they redefined
    it, the built-in `normal`."""
    found = dict(state.priority_classes)
    found.setdefault(BUILTIN_CLASS, BUILTIN)
    return [found[name] for name in sorted(found)]


def class_use_problem(known: PriorityClass, user: str, account: str) -> str | None:
    """Why `user` may not run a job under `account` in class `known`, if so: a class
    that lists users or accounts takes a listed user, or a job of a listed account."""
    if not known.users and not known.accounts:
        return None
    if user in known.users or account in known.accounts:
        return None
    return f"user {user} may not use priority class {known.name} (under account {account})"


def class_problem(state: ClusterState, spec: JobSpec) -> str | None:
    """Admission's check: the job's class exists and its user or account may use it."""
    if spec.priority_class is None:
        return None
    known = class_named(state, spec.priority_class)
    if known is None:
        return f"priority class {spec.priority_class} does not exist"
    return class_use_problem(known, spec.user, spec.account)


def may_preempt(state: ClusterState, spec: JobSpec) -> bool:
    """Whether the job may stop others: no class (an old submission) may, as before;
    a class with `may_preempt` false, or one deleted since, may not."""
    if spec.priority_class is None:
        return True
    known = class_named(state, spec.priority_class)
    return known is not None and known.may_preempt


# --- limits ---------------------------------------------------------------------------


def active_counts(state: ClusterState, *, with_submitted: bool) -> Counter[tuple[str, str]]:
    """Jobs submitted and not final, per ("user", name) and ("account", name).

    `with_submitted` false leaves out the jobs admission has not answered yet (it
    counts those itself, in order). Read from the fold's work lists, not every job.
    """
    ids = set(state.admitted) | state.queued
    for jobs in state.on_node.values():
        ids |= jobs
    if with_submitted:
        ids |= state.submitted
    counts: Counter[tuple[str, str]] = Counter()
    for job_id in ids:  # sums: the order does not matter
        spec = state.jobs[job_id].spec
        counts[("user", spec.user)] += 1
        counts[("account", spec.account)] += 1
    return counts


def submit_limit_problem(
    state: ClusterState,
    user: str,
    account: str,
    adding: int,
    array_size: int | None,
    counts: Counter[tuple[str, str]],
) -> str | None:
    """Why `adding` more jobs of `user` under `account` (an array of `array_size`
    tasks, or None) would pass a limit, given `counts` of jobs already submitted; the
    user's limits first, then the account's."""
    for identity in (("user", user), ("account", account)):
        limits = state.limits.get(identity, IdentityLimits())
        scope, name = identity
        most = limits.max_array_size
        if array_size is not None and most is not None and array_size > most:
            return (
                f"{scope} {name} may submit job arrays of at most {most} tasks, this one has "
                f"{array_size} (max_array_size)"
            )
        most = limits.max_submit_jobs
        have = counts[identity]
        if most is not None and have + adding > most:
            more = f", and this submission adds {adding}" if adding > 1 else ""
            return (
                f"{scope} {name} has {have} jobs submitted{more}, the maximum is {most} "
                "(max_submit_jobs)"
            )
    return None


class SubmitTally:
    """The jobs each user and account has submitted and not finished, as admission
    admits them in order: what `max_submit_jobs` and `max_array_size` are held to.

    A job array is judged whole at its first task: all its waiting tasks count, and
    every task gets the same answer (an array is accepted whole or not at all).
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.counts = active_counts(state, with_submitted=False) if state.limits else None
        self.arrays: dict[str, str | None] = {}

    def problem(self, job: JobState) -> str | None:
        """Why `job` would pass a limit, else None, and then it counts."""
        if self.counts is None:
            return None
        spec = job.spec
        if job.array_id is not None:
            if job.array_id not in self.arrays:
                waiting = [
                    task
                    for task in self.state.array_tasks(job.array_id)
                    if task in self.state.submitted and not self.state.jobs[task].cancel_requested
                ]
                size = self.state.arrays.get(job.array_id, 0)
                self.arrays[job.array_id] = self._take(spec, len(waiting), size)
            return self.arrays[job.array_id]
        return self._take(spec, 1, None)

    def _take(self, spec: JobSpec, adding: int, array_size: int | None) -> str | None:
        assert self.counts is not None
        why = submit_limit_problem(
            self.state, spec.user, spec.account, adding, array_size, self.counts
        )
        if why is None:
            self.counts[("user", spec.user)] += adding
            self.counts[("account", spec.account)] += adding
        return why

"""Limits per user, per account and of the whole cluster, as pure readings of the
folded state (Slurm's `MaxSubmitJobs`, `MaxArraySize`, `GrpTRES=gres/gpu`, `MaxJobCount`).

Limits are on by default: a user's or account's limit that no `LimitsSet` of its own
sets is the default scope's (`("default", "user")`, `("default", "account")`), and
where an operator set none there either, the built-in one (`BUILT_IN`). So one user
cannot fill the queue, the log and every service's memory with one request, and the
cluster as a whole holds at most `BUILT_IN_CLUSTER` jobs not yet final unless an
operator says otherwise (`("cluster", "all")`).

The gateway asks these before it publishes a submission (a clear 403 at once), and
admission asks them again on the log, in submission order, which is what holds: two
submissions may both pass a gateway that has not folded the other yet, and admission
then rejects the one over the limit, with the same words.
"""

from __future__ import annotations

from collections import Counter

from gpuloom.events import JobSpec
from gpuloom.state import ClusterState, JobState
from gpuloom.state.tenancy import CLUSTER_TOTAL, IdentityLimits

#: What a user or account is held to where no operator set a limit (by scope). Slurm's
#: `MaxArraySize` defaults to 1,001; gpuloom's arrays of 10,000 tasks are in its
#: benchmarks, and a user's 10,000 jobs are about 20,000 events and 250 MB across the
#: services (docs/security.md), which one stack bears while serving the others.
BUILT_IN: dict[str, IdentityLimits] = {
    "user": IdentityLimits(max_submit_jobs=10_000, max_array_size=10_000),
    "account": IdentityLimits(),
}
#: Jobs not final of all users together (Slurm's `MaxJobCount`, 10,000 by default, is
#: the same bound for its controller).
BUILT_IN_CLUSTER = IdentityLimits(max_submit_jobs=100_000)


def limits_of(state: ClusterState, scope: str, name: str) -> IdentityLimits:
    """The limits `scope`/`name` is held to: its own, else the defaults, limit by limit."""
    return _either(state.limits.get((scope, name)), default_limits(state, scope))


def default_limits(state: ClusterState, scope: str) -> IdentityLimits:
    """What a user or account (`scope`) with no limit of its own is held to: the
    operators' default, else the built-in one, limit by limit."""
    return _either(state.limits.get(("default", scope)), BUILT_IN.get(scope, IdentityLimits()))


def cluster_limits(state: ClusterState) -> IdentityLimits:
    """The cluster's total: the operators', else the built-in one."""
    return _either(state.limits.get(CLUSTER_TOTAL), BUILT_IN_CLUSTER)


def _either(first: IdentityLimits | None, then: IdentityLimits) -> IdentityLimits:
    if first is None:
        return then
    return IdentityLimits(
        *(
            then_value if value is None else value
            for value, then_value in (
                (first.max_submit_jobs, then.max_submit_jobs),
                (first.max_array_size, then.max_array_size),
                (first.max_gpus, then.max_gpus),
            )
        )
    )


def active_counts(state: ClusterState, *, with_submitted: bool) -> Counter[tuple[str, str]]:
    """Jobs submitted and not final, per ("user", name), ("account", name) and
    `CLUSTER_TOTAL`.

    `with_submitted` false leaves out the jobs admission has not answered yet (it
    counts those itself, in order). Read from the fold's running counts
    (`ClusterState.live_jobs`) and the few submitted jobs, never every job.
    """
    counts = Counter(state.live_jobs)
    if not with_submitted:
        for job_id in state.submitted:  # sums: the order does not matter
            for identity in identities(state.jobs[job_id].spec):
                counts[identity] -= 1
    return counts


def identities(spec: JobSpec) -> tuple[tuple[str, str], ...]:
    """Whose counts a job of `spec` is in."""
    return (("user", spec.user), ("account", spec.account), CLUSTER_TOTAL)


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
    user's limits first, then the account's, then the cluster's."""
    for scope, name in (("user", user), ("account", account)):
        limits = limits_of(state, scope, name)
        most = limits.max_array_size
        if array_size is not None and most is not None and array_size > most:
            source = _source(state, scope, name, "max_array_size")
            return (
                f"{scope} {name} may submit job arrays of at most {most} tasks, this one has "
                f"{array_size} (max_array_size{source})"
            )
        source = _source(state, scope, name, "max_submit_jobs")
        problem = _count_problem(
            f"{scope} {name}", counts[(scope, name)], adding, limits.max_submit_jobs, source
        )
        if problem is not None:
            return problem
    most = cluster_limits(state).max_submit_jobs
    source = " of the cluster" + ("" if CLUSTER_TOTAL in state.limits else ", built in")
    return _count_problem("the cluster", counts[CLUSTER_TOTAL], adding, most, source)


def _count_problem(who: str, have: int, adding: int, most: int | None, source: str) -> str | None:
    if most is None or have + adding <= most:
        return None
    more = f", and this submission adds {adding}" if adding > 1 else ""
    return f"{who} has {have} jobs submitted{more}, the maximum is {most} (max_submit_jobs{source})"


def _source(state: ClusterState, scope: str, name: str, limit: str) -> str:
    """Where `limit` of `scope`/`name` comes from, when not from its own LimitsSet."""
    if getattr(state.limits.get((scope, name), IdentityLimits()), limit) is not None:
        return ""
    if getattr(state.limits.get(("default", scope), IdentityLimits()), limit) is not None:
        return f", the default for {scope}s"
    return f", the built-in default for {scope}s"


class SubmitTally:
    """The jobs each user and account (and the cluster) has submitted and not
    finished, as admission admits them in order: what `max_submit_jobs` and
    `max_array_size` are held to.

    A job array is judged whole at its first task: all its waiting tasks count, and
    every task gets the same answer (an array is accepted whole or not at all).
    """

    def __init__(self, state: ClusterState) -> None:
        self.state = state
        self.counts = active_counts(state, with_submitted=False)
        self.arrays: dict[str, str | None] = {}

    def problem(self, job: JobState) -> str | None:
        """Why `job` would pass a limit, else None, and then it counts."""
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
        why = submit_limit_problem(
            self.state, spec.user, spec.account, adding, array_size, self.counts
        )
        if why is None:
            for identity in identities(spec):
                self.counts[identity] += adding
        return why

"""What one decision round of admission or the queue answers: users take turns, and an
array's waiting tasks are answered together.

Admission and the queue answer every waiting job with an event. A user's
10,000-task array answered task by task would be 20,000 events that every service
folds and the gateway writes as rows, and a job another user submits meanwhile would
wait behind all of them. So:

- an array's tasks waiting together are one `Unit`, answered with one event on the
  array's own id (the fold applies it to every task of the array in the phase it is
  for: `state.rules.jobs.jobs_in`), as a cancel request of an array already is;
- a round answers at most `ROUND` units, taken from each user's units in turn (each
  user's in submission order, users in the order of their oldest waiting job): a job
  submitted during another user's burst is answered in the next round.

Pure and deterministic, as every decision.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import zip_longest

from gpuloom.events import intents
from gpuloom.state import JobState

#: The most units (events) one round of admission or of the queue answers.
ROUND = 500


@dataclass(frozen=True, slots=True)
class Unit:
    """One job, or the waiting tasks of one array (two or more), answered as one."""

    jobs: tuple[JobState, ...]

    @property
    def first(self) -> JobState:
        return self.jobs[0]

    @property
    def answered_id(self) -> str:
        """The id the answer names: the job's, or the array's."""
        if len(self.jobs) > 1 and self.first.array_id is not None:
            return self.first.array_id
        return self.first.job_id

    def msg_id(self, what: intents.Answer) -> str:
        """The answer's intent key: `<job>:<what>` for one job, as always; for an array
        the tasks it covers and their latest event too, since an array's tasks may be
        answered in more than one go (some cancelled, some admitted later)."""
        if len(self.jobs) == 1:
            return intents.answered(self.first.job_id, what)
        latest = max(job.last_seq for job in self.jobs)
        return intents.answered_tasks(self.answered_id, what, len(self.jobs), latest)


def units(jobs: Iterable[JobState], *, arrays: bool = True) -> list[Unit]:
    """`jobs` as units in submission order: an array's tasks among them together
    (unless not `arrays`: each job its own unit)."""
    grouped: dict[str, list[JobState]] = {}
    for job in sorted(jobs, key=lambda j: j.order):
        key = job.job_id if job.array_id is None or not arrays else f"array:{job.array_id}"
        grouped.setdefault(key, []).append(job)
    return [Unit(tuple(group)) for group in grouped.values()]


def in_turns(jobs: Iterable[JobState], limit: int = ROUND, *, arrays: bool = True) -> list[Unit]:
    """At most `limit` units of `jobs`, users taking turns (module doc)."""
    by_user: dict[str, list[Unit]] = {}
    for unit in units(jobs, arrays=arrays):
        by_user.setdefault(unit.first.spec.user, []).append(unit)
    return list(_take(_alternating(by_user.values()), limit))


def _alternating(queues: Iterable[list[Unit]]) -> Iterator[Unit]:
    for turn in zip_longest(*queues):
        yield from (unit for unit in turn if unit is not None)


def _take(found: Iterator[Unit], limit: int) -> Iterator[Unit]:
    for count, unit in enumerate(found):
        if count >= limit:
            return
        yield unit

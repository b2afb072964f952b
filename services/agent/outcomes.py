"""What the runner reports: the result of `Runner.ensure`, a run's end (`Exited`), and
how a run ended as its run folder tells (`read_end`)."""

from __future__ import annotations

from dataclasses import dataclass

from services.agent.containers import podman_failure, read_container_file
from services.agent.reconcile import JobKey
from services.agent.rendezvous import Master
from services.agent.shim import Ended, RunDir, ended


@dataclass(frozen=True, slots=True)
class Exited:
    """A local process ended and its end must be reported."""

    key: JobKey
    node: str
    pid: int | None
    ended: Ended
    #: A gang's replica 0: its rendezvous (for a JobStarted not reported before).
    master: Master | None = None


@dataclass(frozen=True, slots=True)
class Started:
    """`ensure` started a new shim."""

    pid: int
    #: A gang's replica 0: the rendezvous reserved for it.
    master: Master | None = None


@dataclass(frozen=True, slots=True)
class NotStarted:
    """`ensure` could not start the command; nothing runs, report `ended`."""

    ended: Ended


@dataclass(frozen=True, slots=True)
class Resumed:
    """`ensure` found the attempt in its run folder: adopted (pid) or already ended."""

    pid: int | None


EnsureResult = Started | NotStarted | Resumed


def read_end(run: RunDir) -> Ended:
    """How the run ended, with when, from its run folder (podman's own error, for a
    container that podman could not run)."""
    status, reason = run.read_exit(), run.read_reason()
    end = ended(status, reason, run.exit_time())
    name, program = read_container_file(run)
    if reason is None and end.outcome == "failed" and name is not None:
        failure = podman_failure(status, run.file("stderr"), program)
        if failure is not None:
            return Ended("failed", failure[0], failure[1], end.at)
    return end

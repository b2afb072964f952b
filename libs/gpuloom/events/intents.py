"""Every intent key gpuloom writes, made here and nowhere else.

An intent key is the `Nats-Msg-Id` of a decision: the same decision re-made after a
crash or by a second replica gets the same key, so JetStream keeps the first publish
and drops the rest within its de-duplication window (docs/architecture.md, "One log,
one fold, many reactors"); the fold voids what slips past the window. A key therefore
names the fact decided and what makes it unique (the attempt, the replica, the log
position the decision was made at), never a clock or a random id.

Keys are ASCII without spaces (a NATS header value); job ids, node names and
idempotency keys are validated so on their way in (`gpuloom.events.text`).
"""

from __future__ import annotations

from typing import Literal

#: What admission and the queue answer a job or an array's tasks with.
Answer = Literal["admission", "queued"]


def _replica(replica: int) -> str:
    return f":r{replica}" if replica else ""


def submitted(idempotency_key: str) -> str:
    """A submission made with an `Idempotency-Key`: a retry writes nothing new."""
    return f"submit:{idempotency_key}"


def answered(job_id: str, what: Answer) -> str:
    """Admission's or the queue's answer to one job."""
    return f"{job_id}:{what}"


def answered_tasks(array_id: str, what: Answer, tasks: int, latest_seq: int) -> str:
    """The answer to `tasks` waiting tasks of an array at once: their count and latest
    event make it unique, since an array may be answered in more than one go."""
    return f"{array_id}:{what}:{tasks}:{latest_seq}"


def cancel_requested(job_id: str) -> str:
    """A user's cancel request: one per job (an array's id covers its tasks)."""
    return f"{job_id}:cancel-request"


def cancelled(job_id: str) -> str:
    return f"{job_id}:cancelled"


def queue_policy(seq: int) -> str:
    """The queue's policy from its settings, as of log position `seq`."""
    return f"queue-policy:{seq}"


def placed(job_id: str, attempt: int, seq: int) -> str:
    """A placement of `attempt`, decided on the state at log position `seq`."""
    return f"{job_id}:placed:{attempt}:{seq}"


def preempted(job_id: str, attempt: int) -> str:
    return f"{job_id}:preempted:{attempt}"


def grown(job_id: str, attempt: int, seq: int) -> str:
    """An elastic gang's growth in `attempt`, decided on the state at log position `seq`."""
    return f"{job_id}:grown:{attempt}:{seq}"


def shrunk(job_id: str, attempt: int, seq: int) -> str:
    """An elastic gang's shrink in `attempt`, decided on the state at log position `seq`."""
    return f"{job_id}:shrunk:{attempt}:{seq}"


def reserved(job_id: str, seq: int) -> str:
    return f"{job_id}:reserved:{seq}"


def started(job_id: str, attempt: int, replica: int = 0) -> str:
    return f"{job_id}:started:{attempt}{_replica(replica)}"


def finished(job_id: str, attempt: int, replica: int = 0) -> str:
    return f"{job_id}:finished:{attempt}{_replica(replica)}"


def charged(job_id: str, attempt: int, part: int, *, interim: bool) -> str:
    """The `part`-th charge of an attempt (0 for the first): interim while it runs,
    final once it ended."""
    suffix = f":p{part}" if part else ""
    return f"{job_id}:{'charged-interim' if interim else 'charged'}:{attempt}{suffix}"


def node_registered(node: str, seq: int) -> str:
    return f"{node}:registered:{seq}"


def node_recovered(node: str, seq: int) -> str:
    return f"{node}:recovered:{seq}"


def kube_cordoned(node: str, seq: int) -> str:
    """The Kubernetes watcher's cordon of a node Kubernetes marked unschedulable."""
    return f"{node}:kube-cordon:{seq}"


def kube_uncordoned(node: str, seq: int) -> str:
    """The watcher lifting its own cordon once Kubernetes did."""
    return f"{node}:kube-uncordon:{seq}"


def node_lost(node: str, seq: int) -> str:
    return f"{node}:lost:{seq}"


def gpu_unhealthy(node: str, index: int, seen_ms: int) -> str:
    """An agent saw GPU `index` of `node` fail at `seen_ms` (its clock): a GPU that fails
    again after an operator resumed it is a new fact, not a repeat."""
    return f"{node}:gpu-unhealthy:{index}:{seen_ms}"


def webhook_disabled(webhook_id: str) -> str:
    return f"{webhook_id}:disabled"


def dead_letter(service: str, seq: int) -> str:
    """A service's dead letter of log position `seq`: written once per service."""
    return f"{service}:{seq}"


def reservation_started(name: str, start: str) -> str:
    """Reservation `name` reached its start `start` (ISO): once per start it is given."""
    return f"{name}:reservation-started:{start}"


def reservation_ended(name: str, end: str) -> str:
    return f"{name}:reservation-ended:{end}"

"""One event as the fold applies it: the recorded event, and what the rules changed.

The rules say which jobs and nodes an event changed as they change them (`touch`,
`release`, a node's registration ...), on the `Step` they are handed rather than on the
state: the state holds only what the log means, and `apply` returns what each event
changed (`Folded.jobs`, `Folded.nodes`) to whoever keeps caches of it
(`gpuloom.state.changes.ChangeFeed`).

A plain class with slots, not a dataclass: every process makes one per event of the
log, and a frozen dataclass's field-by-field `__init__` made the whole fold about 5%
slower (bench/e2e_throughput.py, issue #37).
"""

from __future__ import annotations

from datetime import datetime

from gpuloom.events import Envelope, Event, Recorded


class Step:
    """A recorded event being folded (its `seq`, `envelope`, `event`, `stored_at`), with
    the jobs and nodes its rule changed (in the order it changed them: a dict as an
    ordered set, so every process reads them alike)."""

    __slots__ = ("envelope", "event", "jobs", "keep_history", "nodes", "seq", "stored_at")

    def __init__(self, recorded: Recorded, *, keep_history: bool = False) -> None:
        self.seq: int = recorded.seq
        self.envelope: Envelope = recorded.envelope
        self.event: Event = recorded.event
        self.stored_at: datetime | None = recorded.stored_at
        #: The fold keeps every job, final and charged ones too (`apply`'s `keep_history`).
        self.keep_history = keep_history
        self.jobs: dict[str, None] = {}
        self.nodes: dict[str, None] = {}

    def changed_job(self, job_id: str) -> None:
        self.jobs[job_id] = None

    def changed_node(self, name: str) -> None:
        """What placement sees of the node may differ: its registration, a GPU's pool,
        its phase or cordon, or what is held on it."""
        self.nodes[name] = None

"""One event as the fold applies it: the recorded event, and what the rules changed.

The rules say which jobs and nodes an event changed as they change them (`touch`,
`release`, a node's registration ...), on the `Step` they are handed rather than on the
state: the state holds only what the log means, and `apply` returns what each event
changed (`Folded.jobs`, `Folded.nodes`) to whoever keeps caches of it
(`gpuloom.state.changes.ChangeFeed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gpuloom.events import Recorded


@dataclass(frozen=True, slots=True)
class Step(Recorded):
    """A recorded event being folded, with the jobs and nodes its rule changed (in the
    order it changed them: a dict as an ordered set, so every process reads them alike)."""

    jobs: dict[str, None] = field(default_factory=dict)
    nodes: dict[str, None] = field(default_factory=dict)
    #: The fold keeps every job, final and charged ones too (`apply`'s `keep_history`).
    keep_history: bool = False

    @classmethod
    def of(cls, recorded: Recorded, *, keep_history: bool = False) -> Step:
        return cls(
            recorded.seq,
            recorded.envelope,
            recorded.event,
            recorded.stored_at,
            keep_history=keep_history,
        )

    def changed_job(self, job_id: str) -> None:
        self.jobs[job_id] = None

    def changed_node(self, name: str) -> None:
        """What placement sees of the node may differ: its registration, a GPU's pool,
        its phase or cordon, or what is held on it."""
        self.nodes[name] = None

"""What the event stream (`GET /v1/events`) reads besides the log: who owns each job it
passes, from the gateway's fold, else from the job rows (a job the fold forgot)."""

from __future__ import annotations

from gpuloom.auth.visibility import Owners
from gpuloom.state import ClusterState
from gpuloom.store.owners import read_model_owner
from services.gateway.reads.source import NOT_READ, Source
from services.gateway.refusals import Refused, unavailable


class EventReads:
    __slots__ = ("_source",)

    def __init__(self, source: Source) -> None:
        self._source = source

    def owners(self) -> Owners | Refused:
        """The owners table every stream of this gateway shares (one table: it holds
        facts); refused (503) before the gateway read the log."""
        read_model = self._source.read_model
        if read_model is None:
            return unavailable(NOT_READ)
        shared = self._source.gateway.streams
        if shared.owners is None:

            def state() -> ClusterState:
                return read_model.state

            shared.owners = Owners(state, read_model_owner(self._source.gateway.sessions))
        return shared.owners

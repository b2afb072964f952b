"""What every read of the gateway reads: its own fold of the log and the SQL rows the
read-model writer keeps (`services.gateway.readmodel`), and the caller's own writes a
read waits for (read-your-writes: docs/architecture.md, "Read models")."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from gpuloom.auth.policy import Accounts
from gpuloom.config import Settings
from gpuloom.decide.explain import Shared
from gpuloom.state import ClusterState
from services.gateway.parts import Gateway
from services.gateway.readmodel import ReadModel
from services.gateway.refusals import Refused, unavailable

#: Why a read of the fold is refused (503) before the gateway has read the log.
NOT_READ = "the gateway has not read the log yet"


class Source:
    """The fold and the rows of one gateway, read at the moment of each call: the read
    model is attached once the gateway reaches NATS (`app.attach_read_model`)."""

    __slots__ = ("gateway",)

    def __init__(self, gateway: Gateway) -> None:
        self.gateway = gateway

    @property
    def settings(self) -> Settings:
        return self.gateway.settings

    @property
    def read_model(self) -> ReadModel | None:
        return self.gateway.read_model

    def folded(self) -> ClusterState | None:
        """The gateway's fold; None before it read the log."""
        read_model = self.gateway.read_model
        return read_model.state if read_model is not None else None

    def fold(self) -> ClusterState | Refused:
        """The gateway's fold, or refused (503 with Retry-After) before it read the log."""
        state = self.folded()
        return state if state is not None else unavailable(NOT_READ)

    def fold_or_empty(self) -> ClusterState:
        """The folded state (an empty one before the gateway read the log)."""
        state = self.folded()
        return state if state is not None else ClusterState()

    def accounts(self) -> Accounts:
        """The account tree the gateway has folded (empty before it read the log)."""
        state = self.folded()
        return state.accounts if state is not None else {}

    def explainer(self, wanted: Iterable[str]) -> Shared | None:
        """The scheduling pass that explains `wanted` (`ReadModel.explainer`)."""
        read_model = self.gateway.read_model
        return read_model.explainer(wanted) if read_model is not None else None

    def session(self) -> Any:
        """A session on the SQL rows (`async with`)."""
        return self.gateway.sessions()

    async def catch_up(self, caller: str) -> bool:
        """Let the read model include `caller`'s own writes through this gateway (a
        bounded wait): not everyone's, so another user's burst is never waited for.
        False: the wait ran out (the answer may miss the caller's latest write)."""
        gateway = self.gateway
        seq = gateway.writes.last(caller)
        read_model = gateway.read_model
        if read_model is None or not seq:
            return True
        reached = await read_model.wait_for(seq, gateway.settings.read_your_writes_timeout_s)
        gateway.writes.reached(caller, min(read_model.written_seq, read_model.state.seq))
        return reached

    async def fold_own_writes(self) -> None:
        """Let the gateway's fold include every write of this gateway, anyone's (an
        operator's new limit holds for the next submission): a bounded wait."""
        gateway = self.gateway
        if gateway.read_model is not None and gateway.writes.latest:
            await gateway.read_model.wait_folded(
                gateway.writes.latest, gateway.settings.read_your_writes_timeout_s
            )

    async def voided_reason(self, seq: int) -> str | None:
        """Why the log voided the event at `seq` (once the gateway's fold has it), or None."""
        read_model = self.gateway.read_model
        if read_model is None:
            return None
        await read_model.wait_folded(seq, self.gateway.settings.read_your_writes_timeout_s)
        for voided in read_model.state.recent_voided:
            if voided.seq == seq:
                return voided.reason
        return None

"""What a pure decision returns: an event to write, with its intent key.

Each service's shell folds the log, calls its decision function when it is caught
up, and publishes what it returns. A `Decision` carries the event and its
`msg_id`, a deterministic intent key: JetStream drops a second publish of the same
key (a retry after a crash), and the fold voids what slips past the window.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpuloom.events.base import Event


@dataclass(frozen=True, slots=True)
class Decision:
    event: Event
    msg_id: str
    #: Envelope id of the event this one answers (the aggregate's latest), if any.
    causation_id: str | None = None

"""Whether this gateway is ready, from successive lag samples: what /readyz
(`ProgressReads.ready`) observes, kept on the `Gateway` (one per gateway)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass
class Readiness:
    """Readiness from successive lag samples (one per probe).

    Not ready until the projection has once come within `max_lag` of the log since
    the gateway started; after that, not ready only while it stays more than
    `max_lag` behind for longer than `grace_s` (a burst of writes is not an outage).
    """

    max_lag: int
    grace_s: float
    caught_up: bool = False
    lagging_since: float | None = None

    def observe(self, lag: int, now: float) -> Literal["ready", "starting", "lagging"]:
        if lag <= self.max_lag:
            self.caught_up = True
            self.lagging_since = None
            return "ready"
        if not self.caught_up:
            return "starting"
        if self.lagging_since is None:
            self.lagging_since = now
        return "lagging" if now - self.lagging_since > self.grace_s else "ready"

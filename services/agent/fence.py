"""Self-fencing: an agent cut off from the bus stops its jobs before they run twice.

Inventory declares a node lost after `node_lost_timeout_s` without a heartbeat, and
the fold requeues its jobs, which placement then starts elsewhere. An agent that is
only cut off (a partition, a dead switch) would go on running the old copies: two
copies of one job, writing the same checkpoints. So the agent fences itself, as
Nomad's `stop_after_client_disconnect` does: once it has had no round trip to the
server for `agent_fence_after_s` (less than the lost timeout), it stops every local
job (SIGTERM, grace, SIGKILL) and starts none.

The fence stays up after the bus comes back until the agent's state has folded the
whole log as it stood then (`resume_seq`): only then does the agent know whether
its node was lost meanwhile. If it was, the fenced jobs are requeued attempts and
their ends are discarded unsent; if not, they are reported failed, with the reason.

`Fence` is the bookkeeping (monotonic times in, no clock read); `watch` is the
shell that probes the connection; `plan` sizes both from the settings.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

log = logging.getLogger(__name__)


@dataclass
class Fence:
    """When the agent last reached the bus, and whether its jobs are fenced."""

    #: Seconds without a round trip to the server after which jobs are stopped.
    after_s: float
    #: time.monotonic() of the latest confirmed round trip.
    last_contact: float
    #: Grace between the steps of a fenced stop (SIGTERM, SIGKILL of the command,
    #: of the group): short enough that all are done before the node is lost.
    grace_s: float = 1.0
    #: Jobs were stopped for a cut-off, and the agent has not caught up since.
    fenced: bool = False
    #: The stream's last sequence when the bus came back; None while still cut off.
    resume_seq: int | None = None

    def contact(self, now: float) -> bool:
        """A round trip succeeded at `now`; True when the fence now needs `resume_seq`."""
        self.last_contact = now
        return self.fenced and self.resume_seq is None

    def silence(self, now: float) -> bool:
        """A probe failed at `now`; True exactly once per cut-off: fence now."""
        self.resume_seq = None  # cut off again: what was caught up with no longer counts
        if self.fenced or now - self.last_contact < self.after_s:
            return False
        self.fenced = True
        return True

    def resumed(self, seq: int) -> None:
        self.resume_seq = seq

    def holds(self, state_seq: int) -> bool:
        """Whether the fence is up for a state folded up to `state_seq`; lifts it once
        that state includes everything the log held when the bus came back."""
        if not self.fenced:
            return False
        if self.resume_seq is None or state_seq < self.resume_seq:
            return True
        log.warning("fence lifted: the agent caught up with the log at seq %d", state_seq)
        self.fenced, self.resume_seq = False, None
        return False


def plan(fence_after_s: float, lost_after_s: float, cancel_grace_s: float) -> tuple[float, float]:
    """(probe interval, fenced-stop grace) for a fence after `fence_after_s`.

    A cut-off is noticed within two probe intervals (a failed probe waits out its
    timeout), and a job that ignores SIGTERM is gone two graces later; together they
    must fit in what is left before the node is declared lost, with a margin.
    """
    interval = min(1.0, fence_after_s / 6)
    budget = lost_after_s - fence_after_s - 2 * interval
    return interval, max(0.1, min(cancel_grace_s, budget / 3))


async def watch(
    fence: Fence,
    probe: Callable[[float], Awaitable[bool]],
    last_seq: Callable[[], Awaitable[int]],
    on_fence: Callable[[float], object],
    stop: asyncio.Event,
    interval_s: float,
) -> None:
    """Probe the bus every `interval_s` until `stop`; call `on_fence(seconds cut off)`
    when the fence goes up, and fetch `resume_seq` when the bus is back."""
    while not stop.is_set():
        reached = await probe(interval_s)
        now = time.monotonic()
        if stop.is_set():
            break
        if not reached:
            if fence.silence(now):
                on_fence(now - fence.last_contact)
        elif fence.contact(now):
            try:
                fence.resumed(await last_seq())
            except Exception as exc:  # the stream is not answering yet: next probe
                log.warning("bus is back, but the stream's last seq is unknown: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)

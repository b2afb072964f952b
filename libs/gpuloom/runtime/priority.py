"""Services no request waits for run behind those that answer people.

On a host that runs the whole stack (`make run`, a small cluster's head node), every
process competes for the same cores. While one user's burst of tasks passes, the
services that fold it into charges, webhook deliveries, rows and node figures are
busy, and without a priority they take as much of the CPU as the gateway answering
everyone else's reads (docs/benchmarks.md, "Another user's latency"). So those
services (`BACKGROUND`) lower their own priority at start, by `GPULOOM_BACKGROUND_NICE`.

Two settings make that priority, and both are set:

* the process's nice value (`setpriority`), which orders processes within one
  scheduling group; it is set before the process starts any thread, so all inherit it;
* the nice value of its *autogroup* (`/proc/self/autogroup`): a Linux kernel with
  `sched_autogroup_enabled` first divides the CPU between sessions, whatever their
  processes' nice values, and each service leads a session of its own. A process that
  shares its session (started in the foreground of a terminal, say) leaves the group
  alone: the group is everyone's in that session.

Only lowered, never raised (that needs privileges): the gateway, admission, the queue,
placement, dispatch and the agents keep the priority they were started with.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger(__name__)

#: The services no request waits on: charges (accounting), webhook deliveries, the SQL
#: rows (a reader waits only for their own writes), and node figures (inventory).
BACKGROUND = frozenset({"accounting", "webhooks", "projector", "inventory"})
AUTOGROUP = Path("/proc/self/autogroup")


def lower_priority(service: str, nice: int, autogroup: Path = AUTOGROUP) -> str | None:
    """Lower this process's priority by `nice` if `service` is a background one (0:
    leave it); what was done, for the start-up log, or None."""
    if nice <= 0 or service not in BACKGROUND:
        return None
    current = os.getpriority(os.PRIO_PROCESS, 0)
    os.setpriority(os.PRIO_PROCESS, 0, max(current, min(19, nice)))
    done = f"nice {os.getpriority(os.PRIO_PROCESS, 0)}"
    if os.getsid(0) == os.getpid():
        try:
            autogroup.write_text(str(min(19, nice)))
            done += ", and so is its session's autogroup"
        except OSError:  # no autogroups (CONFIG_SCHED_AUTOGROUP off), or not allowed
            pass
    return f"{service} runs behind the services that answer requests: {done}"

"""Why a running job is stopped other than its time limit: it holds more GPU memory
than its slice (`gpuwatch`, where NVML answers), or its stdout or stderr passed the
log cap (`confinement`). Each watch reads the running processes and says which to
stop and why; the `Runner` stops them, no more often than `LIVENESS_EVERY_S`."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from services.agent.confinement import log_over_cap
from services.agent.containers import container_of, read_container_id
from services.agent.gpuwatch import GpuMemoryProbe, Limit, over_limit, process_groups
from services.agent.processes import Proc
from services.agent.reconcile import JobKey, Status

log = logging.getLogger(__name__)


def memory_overruns(probe: GpuMemoryProbe, procs: Mapping[JobKey, Proc]) -> dict[JobKey, str]:
    """The running jobs over their GPU memory slice, with the reason (none when the
    probe cannot read the usage: it is asked again next time)."""
    limits = {
        key: Limit(
            proc.pid,
            proc.memory_limits,
            read_container_id(proc.run) if proc.container is not None else None,
        )
        for key, proc in procs.items()
        if proc.status is Status.RUNNING and proc.memory_limits
    }
    if not limits:
        return {}
    try:
        usage = probe.usage()
    except Exception as exc:  # NVML hiccup: try again next time
        log.warning("GPU memory watch could not read usage: %s", exc)
        return {}
    pids = list(usage)
    containers: dict[int, str] = {}
    if any(limit.container is not None for limit in limits.values()):
        containers = {pid: found for pid in pids if (found := container_of(pid)) is not None}
    return over_limit(usage, limits, process_groups(pids), containers)


def log_overruns(procs: Mapping[JobKey, Proc], max_log_bytes: int) -> dict[JobKey, str]:
    """The running jobs whose stdout or stderr passed `max_log_bytes`, with the reason."""
    found = {}
    for key, proc in procs.items():
        if proc.status is Status.RUNNING:
            over = log_over_cap(proc.run, max_log_bytes)
            if over is not None:
                found[key] = over
    return found

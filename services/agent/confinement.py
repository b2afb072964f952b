"""What bounds a running job besides its time limit: its cgroup's limits and its log cap.

The runner (`services.agent.runner`) asks these questions; the answers are pure
reads of the run folder and the job's cgroup (`services.agent.cgroups`):

* `ended_in_group`: how a job ended, told with its group's counters: a job whose
  process the kernel killed at its memory limit fails "killed: memory limit 16 MiB
  reached (the job asked memory_mib=16)"; one that failed after forks were refused
  says that its pids limit was reached.
* `log_over_cap`: a job whose stdout or stderr has grown past `agent_max_log_bytes`
  is stopped and fails naming the cap (checked once a second: a job can write at
  most what it writes in about a second, and its stop's grace, past the cap).
"""

from __future__ import annotations

import contextlib
import logging
import os
from dataclasses import replace

from gpuloom.events import JobSpec
from services.agent.cgroups import RECORD, Cgroups, JobGroup, limits_for, read_record
from services.agent.shim import Ended, RunDir

log = logging.getLogger(__name__)

#: How long a job stopped for its log cap gets between the stop's steps.
LOG_CAP_GRACE_S = 0.2
DEFAULT_MAX_LOG_BYTES = 100 * 1024 * 1024


def ended_in_group(end: Ended, group: JobGroup, stopped_by_agent: bool) -> Ended:
    """`end`, its reason told by `group` where the group's limits ended the job."""
    if end.outcome != "failed" or stopped_by_agent:
        return end
    if group.oom_kills() > 0:
        mib = group.limits.memory_mib
        reason = f"killed: memory limit {mib} MiB reached (the job asked memory_mib={mib})"
        return replace(end, reason=reason)
    refused = group.pids_refused()
    if refused > 0:
        limit = group.limits.pids
        reason = f"{end.reason}; {refused} fork(s) refused: pids limit {limit} reached"
        return replace(end, reason=reason + " (agent_max_pids)")
    return end


def adopted_group(run: RunDir, spec: JobSpec, cgroups: Cgroups | None) -> JobGroup | None:
    """The group an earlier agent made for `run` (its record in the run folder)."""
    try:
        text = run.file(RECORD).read_text()
    except OSError:
        return None
    max_pids = cgroups.max_pids if cgroups is not None else 0
    return read_record(text, limits_for(spec, max_pids))


def release(group: JobGroup, leftover: list[JobGroup]) -> None:
    """Remove an ended job's group (killed before), or keep it in `leftover` to try
    again while a killed process is still on its way out."""
    try:
        if not group.remove():
            leftover.append(group)
    except OSError as exc:
        log.warning("cannot remove cgroup %s: %s", group.lister(), exc)


def release_leftover(leftover: list[JobGroup]) -> None:
    """Try again to remove the groups `release` could not."""
    for group in list(leftover):
        with contextlib.suppress(OSError):
            group.kill()
            if group.remove():
                leftover.remove(group)


def human_bytes(size: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= scale and size % scale == 0:
            return f"{size // scale} {unit}"
    return f"{size} bytes"


def log_over_cap(run: RunDir, cap: int) -> str | None:
    """Why the job must stop for its logs' size (None: both are within `cap`)."""
    for name in ("stdout", "stderr"):
        try:
            size = os.stat(run.file(name)).st_size
        except OSError:
            continue
        if size > cap:
            return f"{name} passed the log cap of {human_bytes(cap)} (agent_max_log_bytes)"
    return None

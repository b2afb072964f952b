"""Subject names of the log: `gpuloom.evt.<aggregate>.<id>.<EventType>` (design §5)."""

from __future__ import annotations

from gpuloom.events.base import Event

EVENT_PREFIX = "gpuloom.evt"
ALL_EVENTS = f"{EVENT_PREFIX}.>"
#: Core (non-log) subjects: heartbeats and agent control.
HEARTBEAT_PREFIX = "gpuloom.hb"
AGENT_CONTROL_PREFIX = "gpuloom.ctl.agent"


def subject_for(event: Event) -> str:
    """The subject an event is published on."""
    return f"{EVENT_PREFIX}.{event.AGGREGATE}.{event.aggregate_id()}.{event.TYPE}"


def job_subjects(job_id: str) -> str:
    """Wildcard subject of every event of one job."""
    return f"{EVENT_PREFIX}.job.{job_id}.*"


def heartbeat_subject(node: str) -> str:
    return f"{HEARTBEAT_PREFIX}.{node}"


def agent_logs_subject(node: str) -> str:
    """Request subject on which the agent serving `node` answers log requests."""
    return f"{AGENT_CONTROL_PREFIX}.{node}.logs"

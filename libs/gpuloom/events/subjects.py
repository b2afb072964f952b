"""Subject names of the log (design §5).

`gpuloom.evt.<aggregate>.<id>.<EventType>`, and for the events a node agent writes,
a sixth token, the node: `gpuloom.evt.job.<id>.<EventType>.<node>`. NATS permissions
are on subjects, so the node in the subject is what lets the server refuse an agent's
JobStarted or JobFinished for another node's job (`gpuloom.bus.identities`); the
decoder checks that the body agrees with its subject (`subject_matches`).
"""

from __future__ import annotations

from gpuloom.events.base import Event

EVENT_PREFIX = "gpuloom.evt"
ALL_EVENTS = f"{EVENT_PREFIX}.>"
#: Core (non-log) subjects: heartbeats and agent control.
HEARTBEAT_PREFIX = "gpuloom.hb"
AGENT_CONTROL_PREFIX = "gpuloom.ctl.agent"

#: Event types whose subject ends with the node they happened on (their `node` field):
#: an agent may publish them only for the nodes it serves. Add a type here when agents
#: gain one.
NODE_BOUND_TYPES: frozenset[str] = frozenset({"JobStarted", "JobFinished"})
#: Event types an agent writes about a node it serves (aggregate `node`, the node's
#: name its id): an agent may publish them only on its own nodes' subjects.
NODE_SELF_TYPES: frozenset[str] = frozenset({"GpuUnhealthy"})


def agent_node_of(subject: str) -> str | None:
    """The node whose agent wrote the event on `subject` (a `NODE_BOUND_TYPES` subject's
    sixth token, a `NODE_SELF_TYPES` subject's id), or None: not an agent's event."""
    parts = subject.split(".")
    if len(parts) == 6 and parts[4] in NODE_BOUND_TYPES:
        return parts[5]
    if len(parts) == 5 and parts[2] == "node" and parts[4] in NODE_SELF_TYPES:
        return parts[3]
    return None


def event_subject(aggregate: str, aggregate_id: str, event_type: str, node: str | None) -> str:
    """The subject of one event, from its parts (`node` for `NODE_BOUND_TYPES` only)."""
    subject = f"{EVENT_PREFIX}.{aggregate}.{aggregate_id}.{event_type}"
    return f"{subject}.{node}" if node is not None else subject


def subject_for(event: Event) -> str:
    """The subject an event is published on."""
    node = getattr(event, "node", None) if event.TYPE in NODE_BOUND_TYPES else None
    return event_subject(event.AGGREGATE, event.aggregate_id(), event.TYPE, node)


def subject_matches(event: Event, subject: str) -> bool:
    """Whether `subject` is where `event` belongs: type, aggregate, id (and node) agree.

    Logs written before agents' events carried their node hold JobStarted and JobFinished
    on the 5-token subject; those are still read. Nobody but the admin identity may
    publish there any more (`gpuloom.bus.identities`), so an agent cannot use it to
    speak for another node.
    """
    if subject == subject_for(event):
        return True
    legacy = event_subject(event.AGGREGATE, event.aggregate_id(), event.TYPE, None)
    return event.TYPE in NODE_BOUND_TYPES and subject == legacy


def job_subjects(job_id: str) -> str:
    """Wildcard subject of every event of one job (agents' events have six tokens)."""
    return f"{EVENT_PREFIX}.job.{job_id}.>"


def heartbeat_subject(node: str) -> str:
    return f"{HEARTBEAT_PREFIX}.{node}"


def agent_control_subjects(node: str) -> str:
    """Every control subject of the agent serving `node` (only that agent subscribes)."""
    return f"{AGENT_CONTROL_PREFIX}.{node}.>"


def agent_logs_subject(node: str) -> str:
    """Request subject on which the agent serving `node` answers log requests."""
    return f"{AGENT_CONTROL_PREFIX}.{node}.logs"


#: The per-node view (`gpuloom.state.nodeview`): what the dispatch process routes to
#: each node, on a stream of its own (`<log>_VIEW`), so that an agent reads its nodes'
#: jobs and nothing else of the log. `gpuloom.view.<node>.job.<job id>` holds the
#: latest record of one job on one node; `gpuloom.view.<node>.position` how far the
#: view of the node is complete. A node name starts with a letter or digit
#: (`gpuloom.bus.identities.check_token`), so no node is called `position`'s sibling.
VIEW_PREFIX = "gpuloom.view"
ALL_VIEWS = f"{VIEW_PREFIX}.>"
#: Core subject on which an agent asks the dispatcher to confirm its nodes' views up
#: to a sequence of the log (`gpuloom.view.sync.<node>` would be stored: not under it).
SYNC_PREFIX = "gpuloom.dispatch.sync"


def view_subjects(node: str) -> str:
    """Every subject of `node`'s view (the one filter its agent may consume)."""
    return f"{VIEW_PREFIX}.{node}.>"


#: Consumers of one node's view its agent may hold at once: its own, and one more (a
#: second copy while the first stops, a tool reading as the agent). Each has a fixed
#: name (`view_consumers`), so no number of requests makes more.
VIEW_CONSUMERS_PER_NODE = 2


def view_consumers(node: str) -> list[str]:
    """The names the consumers of `node`'s view may take (the agent's is the first)."""
    return [f"view-{node}-{index}" for index in range(VIEW_CONSUMERS_PER_NODE)]


def view_job_subject(node: str, job_id: str) -> str:
    return f"{VIEW_PREFIX}.{node}.job.{job_id}"


def view_position_subject(node: str) -> str:
    return f"{VIEW_PREFIX}.{node}.position"


def sync_subject(node: str) -> str:
    return f"{SYNC_PREFIX}.{node}"

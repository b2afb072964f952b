"""Who may write what on the bus: one identity per process, least privilege (design §2.3).

"Each service owns the events it writes" is enforced by nats-server itself: every
process connects as its own identity, and the server's permissions let it publish
only the subjects of the events it owns, its own dead letters, and the JetStream API
calls it makes. A bug or an intruder in one service can then no longer write another
service's facts (a JobPlaced from the gateway, a JobStarted from another node's agent,
a dead letter that advances another service's "covered seq").

This module is pure: the table and the permissions derived from it; the JetStream API
subjects each kind of client calls are `gpuloom.bus.jsapi`. Keys and seeds are
`gpuloom.bus.keyring`; the server's configuration is `gpuloom.natsserver`.

Identities:
- one per service (`SERVICES`), publishing exactly `WRITERS[service]`;
- one per agent process, covering exactly the nodes it serves: its events carry the
  node as their subject's sixth token (`gpuloom.events.subjects`). An agent does not
  read the log: it reads its nodes' subjects of the per-node view, which the
  `dispatch` service writes (`gpuloom.state.nodeview`), and nothing else;
- `reader`: for outside subscribers, reads and consumes, publishes only read calls;
- `admin`: operator tools (audit, replay, `gpuloom log`) and tests: everything.

Inboxes are per identity (`_INBOX.<public key>`, `inbox_prefix`), so that no
identity can read the replies (JetStream answers, an agent's job logs) of another.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from gpuloom.bus.jsapi import (
    base_snapshot_api,
    others_durables,
    own_durables,
    read_api,
    snapshot_api,
    writer_api,
)
from gpuloom.events.subjects import (
    AGENT_CONTROL_PREFIX,
    EVENT_PREFIX,
    NODE_BOUND_TYPES,
    NODE_SELF_TYPES,
    SYNC_PREFIX,
    VIEW_PREFIX,
    agent_control_subjects,
    event_subject,
    heartbeat_subject,
    sync_subject,
    view_consumers,
    view_subjects,
)

#: The gpuloom services, each its own identity (the agents are added per process).
SERVICES = (
    "gateway",
    "admission",
    "queue",
    "placement",
    "inventory",
    "accounting",
    "webhooks",
    "dispatch",
    "projector",
    # Kubernetes (docs/kubernetes.md): run only where gpuloom schedules a cluster's pods
    "extender",
    "kubewatch",
)
ADMIN = "admin"
READER = "reader"
#: Writers that are not services: the node agents (any agent identity) and the admin's
#: tools (`gpuloom audit` records its result).
AGENT = "agent"

#: Event type -> (aggregate, writer): the one table of who may assert which fact.
#: Derived from the code (who constructs and publishes each event); a new event type
#: gets a line here, and the unit test fails until it does. The aggregate is the
#: subject's second token; the test checks it against the event's class.
WRITERS: dict[str, tuple[str, str]] = {
    # gateway: what users and operators ask for over REST
    "JobSubmitted": ("job", "gateway"),
    "JobArraySubmitted": ("job", "gateway"),
    "JobCancelRequested": ("job", "gateway"),
    "AccountCreated": ("account", "gateway"),
    "AccountUsersSet": ("account", "gateway"),
    "AccountCoordinatorsSet": ("account", "gateway"),
    "SharesSet": ("account", "gateway"),
    "QuotaSet": ("account", "gateway"),
    "NodeCordoned": ("node", "gateway"),
    "NodeUncordoned": ("node", "gateway"),
    "NodeRemoved": ("node", "gateway"),
    "GpuPoolChanged": ("node", "gateway"),
    "GpuHealthy": ("node", "gateway"),
    "PriorityClassSet": ("priorityclass", "gateway"),
    "PriorityClassDeleted": ("priorityclass", "gateway"),
    "LimitsSet": ("limits", "gateway"),
    "ReservationCreated": ("reservation", "gateway"),
    "ReservationUpdated": ("reservation", "gateway"),
    "ReservationDeleted": ("reservation", "gateway"),
    "WebhookRegistered": ("webhook", "gateway"),
    "WebhookDeleted": ("webhook", "gateway"),
    "WebhookRenewed": ("webhook", "gateway"),
    # admission
    "JobAdmitted": ("job", "admission"),
    "JobRejected": ("job", "admission"),
    # queue
    "JobQueued": ("job", "queue"),
    "JobCancelled": ("job", "queue"),
    "QueuePolicySet": ("queue", "queue"),
    # placement
    "JobPlaced": ("job", "placement"),
    "JobPreempted": ("job", "placement"),
    "JobReserved": ("job", "placement"),
    "JobGrown": ("job", "placement"),
    "JobShrunk": ("job", "placement"),
    "ReservationStarted": ("reservation", "placement"),
    "ReservationEnded": ("reservation", "placement"),
    # inventory
    "NodeRegistered": ("node", "inventory"),
    "NodeLost": ("node", "inventory"),
    "NodeRecovered": ("node", "inventory"),
    # accounting
    "UsageCharged": ("job", "accounting"),
    # webhooks: a receiver that answered 410, or a failing one's backlog
    "WebhookDisabled": ("webhook", "webhooks"),
    # node agents, each for its own nodes only (NODE_BOUND_TYPES)
    "JobStarted": ("job", AGENT),
    "JobFinished": ("job", AGENT),
    "GpuUnhealthy": ("node", AGENT),  # the node is the subject's id: its own nodes only
    # operator tools
    "AuditCompleted": ("audit", ADMIN),
}

#: Events that one more writer may assert besides their owner in `WRITERS`: the
#: Kubernetes services stand in for the gateway, the inventory and the agents where
#: the Kubernetes API is the source of those facts (docs/kubernetes.md). The scheduler
#: extender submits each pod kube-scheduler asks about; the watcher registers, loses and
#: cordons Kubernetes nodes, and reports pods bound, ended or deleted. Neither may
#: publish anything else: the bus refuses a JobPlaced from either, as from any service.
ALSO_WRITTEN_BY: dict[str, tuple[str, ...]] = {
    "JobSubmitted": ("extender",),
    "JobCancelRequested": ("kubewatch",),
    "NodeRegistered": ("kubewatch",),
    "NodeLost": ("kubewatch",),
    "NodeRecovered": ("kubewatch",),
    "NodeCordoned": ("kubewatch",),
    "NodeUncordoned": ("kubewatch",),
    "JobStarted": ("kubewatch",),
    "JobFinished": ("kubewatch",),
}

_TOKEN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_\-]{0,62}$")


@dataclass(frozen=True, slots=True)
class Permissions:
    """What one identity may publish and subscribe to (nats-server `permissions`).

    `None` for both: no restriction (admin). `allow_responses`: the identity may
    publish a reply to a request it received (an agent answering the gateway's log
    request on the gateway's own inbox), once, and nothing else on that inbox.
    """

    publish: tuple[str, ...] | None
    subscribe: tuple[str, ...] | None
    allow_responses: bool = False
    #: Subjects refused even where `publish` allows them: the durable consumers of
    #: other services (a reader may make and pull its own consumers, not theirs).
    deny_publish: tuple[str, ...] = ()


def check_token(kind: str, name: str) -> str:
    """`name` if it is one plain subject token; a node named `>` must not become `>`."""
    if not _TOKEN.fullmatch(name):
        raise ValueError(f"{kind} {name!r}: letters, digits, '-' and '_' only (a subject token)")
    return name


def inbox_prefix(public_key: str) -> str:
    """The inbox prefix of the identity with `public_key` (its replies, its consumers)."""
    return f"_INBOX.{public_key}"


def events_of(writer: str) -> list[str]:
    """The event types `writer` may publish (it owns them, or `ALSO_WRITTEN_BY` names
    it), in table order."""
    return [
        event_type
        for event_type, (_, owner) in WRITERS.items()
        if owner == writer or writer in ALSO_WRITTEN_BY.get(event_type, ())
    ]


def event_permission(event_type: str, node: str | None = None) -> str:
    """The subject pattern that lets its owner publish `event_type` (for `node`)."""
    aggregate, _ = WRITERS[event_type]
    if event_type in NODE_SELF_TYPES:  # an agent's event about its own node
        if node is None:
            raise ValueError(f"{event_type} is published per node")
        return event_subject(aggregate, node, event_type, None)
    if event_type in NODE_BOUND_TYPES:
        if node is None:
            raise ValueError(f"{event_type} is published per node")
        return event_subject(aggregate, "*", event_type, node)
    return event_subject(aggregate, "*", event_type, None)


def service_permissions(service: str, public_key: str, stream: str) -> Permissions:
    """The permissions of one gpuloom service (`SERVICES`)."""
    if service not in SERVICES:
        raise ValueError(f"unknown service {service!r}: one of {', '.join(SERVICES)}")
    inbox = f"{inbox_prefix(public_key)}.>"
    publish = [
        event_permission(t, "*") if t in NODE_BOUND_TYPES else event_permission(t)
        for t in events_of(service)
    ]  # a node-bound event from a service: the Kubernetes watcher, for Kubernetes nodes
    publish += writer_api(stream, service) + read_api(stream)
    publish += snapshot_api(service) + base_snapshot_api()
    publish += own_durables(stream, service)
    subscribe = [inbox]
    if service == "gateway":  # asks the agents for job logs
        publish.append(f"{AGENT_CONTROL_PREFIX}.*.>")
    if service == "inventory":  # heartbeats of every node
        subscribe.append(heartbeat_subject("*"))
    if service == "dispatch":  # writes the per-node view, answers agents' syncs
        view = f"{stream}_VIEW"
        publish += [f"{VIEW_PREFIX}.>", f"$JS.API.STREAM.INFO.{view}"]
        subscribe.append(f"{SYNC_PREFIX}.*")
    return Permissions(
        tuple([*publish, inbox]), tuple(subscribe), deny_publish=others_durables(stream, service)
    )


def agent_permissions(nodes: Sequence[str], public_key: str, stream: str) -> Permissions:
    """An agent process serving `nodes`: their events, heartbeats and control subjects,
    and their views: consumers of the view stream filtered to one of its nodes (the
    server checks that the filter in the request is the one in its subject), under the
    few names each node's consumers may take (so that no agent holds more), pulling
    from them and deleting them, and asking the dispatcher to confirm a node's view. Of the
    log, only its last sequence (stream info): never a message."""
    if not nodes:
        raise ValueError("an agent serves at least one node")
    for node in nodes:
        check_token("node", node)
    inbox = f"{inbox_prefix(public_key)}.>"
    view = f"{stream}_VIEW"
    publish = [event_permission(t, n) for n in nodes for t in events_of(AGENT)]
    publish += [heartbeat_subject(n) for n in nodes]
    publish += [sync_subject(n) for n in nodes]
    publish += [
        "$JS.API.INFO",
        f"$JS.API.STREAM.INFO.{stream}",
        f"$JS.API.STREAM.INFO.{stream}_DLQ",
    ]
    for node in nodes:  # a fixed number of consumers per node: named, not any name
        for name in view_consumers(node):
            publish += [
                f"$JS.API.CONSUMER.CREATE.{view}.{name}.{view_subjects(node)}",
                f"$JS.API.CONSUMER.MSG.NEXT.{view}.{name}",
                f"$JS.API.CONSUMER.DELETE.{view}.{name}",
            ]
    publish.append(inbox)
    subscribe = [agent_control_subjects(n) for n in nodes] + [inbox]
    return Permissions(tuple(publish), tuple(subscribe), allow_responses=True)


def reader_permissions(public_key: str, stream: str) -> Permissions:
    """Outside subscribers: read the log (live or replayed), write nothing."""
    inbox = f"{inbox_prefix(public_key)}.>"
    return Permissions(
        tuple(read_api(stream)),
        (inbox, f"{EVENT_PREFIX}.>"),
        deny_publish=others_durables(stream, None),
    )


ADMIN_PERMISSIONS = Permissions(None, None)


@dataclass(frozen=True, slots=True)
class Identity:
    """One user of the bus: its name, its nkey's public key, and what it may do."""

    name: str
    public_key: str
    permissions: Permissions


def identities(
    keys: Mapping[str, str], agents: Mapping[str, Sequence[str]], stream: str
) -> list[Identity]:
    """Every identity of a stack: `keys` maps identity name -> public key (services,
    `reader`, `admin` when it is an nkey, and each agent), `agents` agent -> nodes.

    A name in `keys` that is neither a service, an agent, `reader` nor `admin` is an
    error: an unknown identity must not get a default set of rights.
    """
    found = []
    for name in sorted(keys):
        key = keys[name]
        if name in SERVICES:
            permissions = service_permissions(name, key, stream)
        elif name in agents:
            permissions = agent_permissions(agents[name], key, stream)
        elif name == READER:
            permissions = reader_permissions(key, stream)
        elif name == ADMIN:
            permissions = ADMIN_PERMISSIONS
        else:
            raise ValueError(f"identity {name!r} has a key but no role")
        found.append(Identity(name, key, permissions))
    return found


def nodes_served(agents: Mapping[str, Sequence[str]]) -> dict[str, str]:
    """node -> the agent serving it; a node served by two agents is an error (either
    could then write the other's facts)."""
    owner: dict[str, str] = {}
    for agent, nodes in agents.items():
        check_token("agent", agent)
        for node in nodes:
            if node in owner and owner[node] != agent:
                raise ValueError(f"node {node} is served by both {owner[node]} and {agent}")
            owner[node] = agent
    return owner


def may_publish(permissions: Permissions, subject: str) -> bool:
    """Whether `permissions` allow publishing on `subject` (NATS wildcard matching)."""
    if permissions.publish is None:
        return True
    if any(subject_matches_pattern(pattern, subject) for pattern in permissions.deny_publish):
        return False
    return any(subject_matches_pattern(pattern, subject) for pattern in permissions.publish)


def subject_matches_pattern(pattern: str, subject: str) -> bool:
    """NATS matching: `*` one token, `>` one or more trailing tokens."""
    want, have = pattern.split("."), subject.split(".")
    for index, token in enumerate(want):
        if token == ">":
            return len(have) > index
        if index >= len(have) or (token != "*" and token != have[index]):
            return False
    return len(have) == len(want)

"""Node inventory: register, lose and recover nodes from what their heartbeats say.

Heartbeats are not in the log (design §3): the shell keeps when it last heard each
node and passes it here together with `now`, both read at the edge.

Two rules keep one bad heartbeat, or a hiccup on inventory's own side, from hurting
the whole cluster:

- **Containment.** Each node is decided on its own: one whose data cannot become
  an event is skipped (and reported), the others are still registered or lost.
- **No mass loss on a stall.** Silence seen by inventory is either the nodes' or
  its own (its process paused, its NATS connection down: then *every* node looks
  silent at once). So a watch that was interrupted restarts (`watch_start`), and
  when more than `LossLimit.max_fraction` of the ready nodes (and more than one)
  are silent at once, a node is lost only after one more timeout of silence, and
  at most `LossLimit.per_timeout` nodes per timeout, the longest silent first.
  Kubernetes' node lifecycle controller slows evictions the same way when most of
  a zone looks unhealthy. A single silent node is lost on time, as before.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpuloom.events import Decision, NodeLost, NodeRecovered, NodeRegistered, NodeSpec, intents
from gpuloom.state import ClusterState, registration_conflict
from gpuloom.state.feasibility import KUBERNETES


@dataclass(frozen=True, slots=True)
class Heard:
    """The latest heartbeat of one node: when it arrived and the spec it carried."""

    at: datetime
    spec: NodeSpec


@dataclass(frozen=True, slots=True)
class LossLimit:
    """How fast many silent nodes may be declared lost."""

    #: More silent nodes than this share of the ready ones is a mass silence (1: never).
    max_fraction: float = 0.5
    #: In a mass silence, at most this many nodes are lost per timeout.
    per_timeout: int = 1


@dataclass(frozen=True, slots=True)
class InventoryRound:
    """One round's decisions, and the nodes skipped because their data was unusable."""

    decisions: list[Decision]
    skipped: list[tuple[str, str]] = field(default_factory=list)


def watch_start(
    since: datetime,
    previous_round: datetime | None,
    now: datetime,
    timeout: timedelta,
    *,
    listening: bool = True,
) -> datetime:
    """When this inventory's uninterrupted watch of the heartbeats began.

    Rounds come at least every quarter timeout; a gap over half the timeout means
    inventory was away (paused, busy) and may not have read the heartbeats that
    came meanwhile, and while it is not `listening` (NATS connection down) it
    reads none. Either way the watch restarts at `now`: every node gets a full
    timeout to be heard again.
    """
    if not listening or (previous_round is not None and now - previous_round > timeout / 2):
        return now
    return since


def decide_inventory(
    state: ClusterState,
    heard: dict[str, Heard],
    now: datetime,
    timeout: timedelta,
    watching_since: datetime,
    limit: LossLimit | None = None,
) -> list[Decision]:
    """The decisions of `inventory_round` (the nodes skipped are dropped)."""
    return inventory_round(state, heard, now, timeout, watching_since, limit).decisions


def inventory_round(
    state: ClusterState,
    heard: dict[str, Heard],
    now: datetime,
    timeout: timedelta,
    watching_since: datetime,
    limit: LossLimit | None = None,
) -> InventoryRound:
    """New or changed nodes register, silent ones are lost, lost ones that speak recover.

    A changed spec that the fold would void (a GPU index twice, a GPU a job holds
    gone) is not proposed: proposing it would void it again after every fold.

    A node is silent when neither its last heartbeat nor `watching_since` (when
    this inventory's watch began) is within `timeout` of `now`. Decisions are in
    node order: registrations and recoveries, then losses.
    """
    result = InventoryRound([])
    for name in sorted(heard):
        try:
            decision = _from_heartbeat(state, name, heard[name], now, timeout)
        except Exception as exc:  # containment: this node's data, not the round
            result.skipped.append((name, f"{type(exc).__name__}: {exc}"))
            continue
        if decision is not None:
            result.decisions.append(decision)
    for name, silence in _to_lose(state, heard, now, timeout, watching_since, limit or LossLimit()):
        try:
            event = NodeLost(node=name, reason=f"no heartbeat for {silence:.1f}s")
        except Exception as exc:
            result.skipped.append((name, f"{type(exc).__name__}: {exc}"))
            continue
        result.decisions.append(Decision(event, intents.node_lost(name, state.seq)))
    return result


def _from_heartbeat(
    state: ClusterState, name: str, beat: Heard, now: datetime, timeout: timedelta
) -> Decision | None:
    if now - beat.at > timeout:
        return None
    node = state.nodes.get(name)
    if node is None or node.spec.fingerprint != beat.spec.fingerprint:
        if registration_conflict(name, node, beat.spec) is not None:
            return None  # the fold would void it; the agent's log says why
        return Decision(
            NodeRegistered(node=name, spec=beat.spec), intents.node_registered(name, state.seq)
        )
    if node.phase == "lost":
        return Decision(NodeRecovered(node=name), intents.node_recovered(name, state.seq))
    return None


def _to_lose(
    state: ClusterState,
    heard: dict[str, Heard],
    now: datetime,
    timeout: timedelta,
    watching_since: datetime,
    limit: LossLimit,
) -> list[tuple[str, float]]:
    """The ready nodes to declare lost now, in node order, with their silence (seconds).
    A Kubernetes node sends no heartbeat: the Kubernetes watcher loses it (its Ready
    condition, its deletion), never the inventory."""
    ready = [
        name
        for name in sorted(state.nodes)
        if state.nodes[name].phase == "ready" and KUBERNETES not in state.nodes[name].spec.runtimes
    ]
    silent: list[tuple[timedelta, str]] = []
    for name in ready:
        latest = heard.get(name)
        last = max(latest.at, watching_since) if latest else watching_since
        if now - last > timeout:
            silent.append((now - last, name))
    if len(silent) > 1 and len(silent) > limit.max_fraction * len(ready):
        recently_lost = sum(
            1
            for node in state.nodes.values()
            if node.phase == "lost" and node.lost_at is not None and now - node.lost_at <= timeout
        )
        budget = max(0, limit.per_timeout - recently_lost)
        longest_first = sorted(silent, key=lambda pair: (-pair[0], pair[1]))
        silent = [pair for pair in longest_first if pair[0] > 2 * timeout][:budget]
    return [(name, silence.total_seconds()) for silence, name in sorted(silent, key=_by_name)]


def _by_name(pair: tuple[timedelta, str]) -> str:
    return pair[1]

"""Node inventory: register, lose and recover nodes from what their heartbeats say.

Heartbeats are not in the log (design §3): the shell keeps when it last heard each
node and passes it here together with `now`, both read at the edge.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from gpuloom.decide import Decision
from gpuloom.events import NodeLost, NodeRecovered, NodeRegistered, NodeSpec
from gpuloom.state import ClusterState, registration_conflict


@dataclass(frozen=True, slots=True)
class Heard:
    """The latest heartbeat of one node: when it arrived and the spec it carried."""

    at: datetime
    spec: NodeSpec


def decide_inventory(
    state: ClusterState,
    heard: dict[str, Heard],
    now: datetime,
    timeout: timedelta,
    watching_since: datetime,
) -> list[Decision]:
    """New or changed nodes register, silent ones are lost, lost ones that speak recover.

    A changed spec that the fold would void (a GPU index twice, a GPU a job holds
    gone) is not proposed: proposing it would void it again after every fold.

    A node is silent when neither its last heartbeat nor `watching_since` (when
    this inventory started listening) is within `timeout` of `now`.
    """
    decisions: list[Decision] = []
    for name in sorted(heard):
        beat = heard[name]
        if now - beat.at > timeout:
            continue
        node = state.nodes.get(name)
        if node is None or node.spec.fingerprint != beat.spec.fingerprint:
            if registration_conflict(name, node, beat.spec) is not None:
                continue  # the fold would void it; the agent's log says why
            decisions.append(
                Decision(
                    NodeRegistered(node=name, spec=beat.spec), f"{name}:registered:{state.seq}"
                )
            )
        elif node.phase == "lost":
            decisions.append(Decision(NodeRecovered(node=name), f"{name}:recovered:{state.seq}"))
    for name in sorted(state.nodes):
        node = state.nodes[name]
        if node.phase != "ready":
            continue
        latest = heard.get(name)
        last = max(latest.at, watching_since) if latest else watching_since
        if now - last > timeout:
            silent = (now - last).total_seconds()
            decisions.append(
                Decision(
                    NodeLost(node=name, reason=f"no heartbeat for {silent:.1f}s"),
                    f"{name}:lost:{state.seq}",
                )
            )
    return decisions

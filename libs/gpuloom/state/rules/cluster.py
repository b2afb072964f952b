"""The fold's rules of what holds for the whole cluster: the queue's policy (weights,
half-life, backfill, preemption) and the last audit's result."""

from __future__ import annotations

from gpuloom.events import AuditCompleted, QueuePolicySet
from gpuloom.state.errors import Invalid
from gpuloom.state.model import ClusterState
from gpuloom.state.rules.common import Rule, rule
from gpuloom.state.step import Step


def _queue_policy(state: ClusterState, event: QueuePolicySet, step: Step) -> None:
    state.queue_policy = event
    for usage in state.decayed_usage.values():
        usage.half_life_s = event.fair_share_half_life_s


def _audited(state: ClusterState, event: AuditCompleted, step: Step) -> None:
    if event.to_seq >= step.seq:
        raise Invalid(f"an audit cannot cover seq {event.to_seq}, at or after its own")
    state.last_audit = event


RULES: tuple[Rule, ...] = (
    rule(QueuePolicySet, _queue_policy),
    rule(AuditCompleted, _audited),
)

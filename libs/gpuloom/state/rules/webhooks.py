"""Fold rules of webhooks: the subscriptions every gateway delivers to.

Pure like every rule: the registration's sequence and time come from the log.
"""

from __future__ import annotations

from dataclasses import replace

from gpuloom.events.webhooks import (
    WebhookDeleted,
    WebhookDisabled,
    WebhookRegistered,
    WebhookRenewed,
)
from gpuloom.state.errors import Invalid
from gpuloom.state.model import ClusterState
from gpuloom.state.rules.common import Rule, rule
from gpuloom.state.step import Step
from gpuloom.state.tenancy import Webhook


def _registered(state: ClusterState, event: WebhookRegistered, step: Step) -> None:
    if event.webhook_id in state.webhooks:
        raise Invalid(f"webhook {event.webhook_id} exists")
    state.webhooks[event.webhook_id] = Webhook(
        webhook_id=event.webhook_id,
        owner=event.owner,
        operator=event.operator,
        operator_until=event.operator_until,
        url=event.url,
        types=tuple(event.types),
        job=event.job,
        user=event.user,
        account=event.account,
        node=event.node,
        secret_sealed=event.secret_sealed,
        description=event.description,
        registered_seq=step.seq,
        registered_at=step.envelope.at,
    )


def _deleted(state: ClusterState, event: WebhookDeleted, step: Step) -> None:
    if state.webhooks.pop(event.webhook_id, None) is None:
        raise Invalid(f"webhook {event.webhook_id} does not exist")


def _disabled(state: ClusterState, event: WebhookDisabled, step: Step) -> None:
    hook = state.webhooks.get(event.webhook_id)
    if hook is None:
        raise Invalid(f"webhook {event.webhook_id} does not exist")
    if hook.disabled is None:  # the first reason stays
        state.webhooks[event.webhook_id] = replace(hook, disabled=event.reason)


def _renewed(state: ClusterState, event: WebhookRenewed, step: Step) -> None:
    hook = state.webhooks.get(event.webhook_id)
    if hook is None:
        raise Invalid(f"webhook {event.webhook_id} does not exist")
    state.webhooks[event.webhook_id] = replace(
        hook, operator=event.operator, operator_until=event.operator_until
    )


RULES: tuple[Rule, ...] = (
    rule(WebhookRegistered, _registered),
    rule(WebhookDeleted, _deleted),
    rule(WebhookDisabled, _disabled),
    rule(WebhookRenewed, _renewed),
)

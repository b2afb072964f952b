"""WebhookDisabled, the one event the webhooks process writes: when a receiver answers
410 Gone, or its backlog is over the limit while it fails (`gpuloom.webhooks.policy`)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime

from gpuloom.bus import EventBus, Outgoing
from gpuloom.events import encode, intents, make_envelope, subject_for
from gpuloom.events.webhooks import WebhookDisabled
from gpuloom.state import ClusterState
from gpuloom.telemetry import inject
from gpuloom.webhooks.policy import redacted
from services.webhooks.fold import SERVICE
from services.webhooks.outbox import Disable

log = logging.getLogger(__name__)


def disabler(bus: EventBus, state: Callable[[], ClusterState], timeout_s: float) -> Disable:
    """Disable a webhook that delivers (as the fold knows it), saying why.

    The intent key `<webhook>:disabled` is the `Nats-Msg-Id`, so two replicas, or a
    retry, deciding the same write it once (and the fold voids a later repeat). A log
    that is away is logged: the next failure of the receiver asks again."""

    async def disable(hook_id: str, reason: str) -> None:
        hook = state().webhooks.get(hook_id)
        if hook is None or hook.disabled is not None:
            return
        log.warning("webhooks: disabling %s (%s): %s", hook_id, redacted(hook.url), reason)
        event = WebhookDisabled(webhook_id=hook_id, reason=reason)
        envelope = make_envelope(event, at=datetime.now(UTC), by=SERVICE, correlation_id=hook_id)
        headers = inject({"Nats-Msg-Id": intents.webhook_disabled(hook_id)})
        try:
            await bus.publish(Outgoing(subject_for(event), encode(envelope), headers), timeout_s)
        except Exception as exc:
            log.warning("webhooks: could not disable %s: %s", hook_id, exc)

    return disable

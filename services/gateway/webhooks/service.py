"""The gateway's webhook machinery, started beside its projector: the outbox and the
sender (`services.gateway.webhooks`)."""

from __future__ import annotations

import asyncio
import logging

from gpuloom.auth import Principal
from gpuloom.bus import EventBus
from gpuloom.events.webhooks import WebhookDisabled
from gpuloom.runtime.projector import Projector
from gpuloom.tasks import cancel_and_wait
from services.gateway.auth import accounts_of
from services.gateway.deps import Gateway
from services.gateway.publish import publish
from services.gateway.routes_events import owner_lookup
from services.gateway.stream import Owners
from services.gateway.webhooks.outbox import Outbox
from services.gateway.webhooks.policy import redacted
from services.gateway.webhooks.sealing import load_sealer
from services.gateway.webhooks.sender import Sender

log = logging.getLogger(__name__)

#: Who the log names as the author of a WebhookDisabled the gateway decides itself.
GATEWAY = Principal("gpuloom-gateway")


async def run_webhooks(
    gateway: Gateway, bus: EventBus, projector: Projector, stop: asyncio.Event
) -> None:
    """Deliver webhooks until `stop`, once the projector has read the log up to where it
    ended at the gateway's start (the webhooks registered so far are known then)."""
    # httpx logs every request's URL at INFO: a receiver's path and query may hold its
    # secret, so only warnings of it are logged (ours name the webhook and its host).
    logging.getLogger("httpx").setLevel(logging.WARNING)
    while not stop.is_set() and not await projector.wait_for(gateway.start_seq, timeout=1.0):
        pass

    async def disable(hook_id: str, reason: str) -> None:
        hook = projector.state.webhooks.get(hook_id)
        if hook is None or hook.disabled is not None:
            return
        log.warning("webhooks: disabling %s (%s): %s", hook_id, redacted(hook.url), reason)
        try:
            await publish(
                gateway, WebhookDisabled(webhook_id=hook_id, reason=reason), principal=GATEWAY
            )
        except Exception as exc:  # the log is away: the next failure asks again
            log.warning("webhooks: could not disable %s: %s", hook_id, exc)

    sender = Sender(
        gateway.settings,
        gateway.sessions,
        lambda: projector.state,
        lambda: outbox.covered_seq,
        load_sealer(gateway.settings),
        disable,
    )
    outbox = Outbox(
        bus,
        projector,
        gateway.sessions,
        Owners(lambda: projector.state, owner_lookup(gateway)),
        lambda: accounts_of(gateway),
        gateway.streams.decoded,
        sender.notify,
        disable,
        max_backlog=gateway.settings.webhook_max_backlog,
        backlog_grace_s=gateway.settings.webhook_backlog_grace_s,
    )
    tasks = [asyncio.create_task(outbox.run(stop)), asyncio.create_task(sender.run(stop))]
    try:
        await stop.wait()
    finally:
        await cancel_and_wait(*tasks)

"""Write one event to the log for a request; 503 when the log cannot take it."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from nats.errors import Error as NatsError

from gpuloom.bus import Outgoing
from gpuloom.events import Event, Recorded, decode, encode, make_envelope, subject_for
from gpuloom.telemetry import inject
from services.gateway.deps import Gateway, unavailable

log = logging.getLogger(__name__)


async def publish(gateway: Gateway, event: Event, msg_id: str | None = None) -> Recorded:
    """Publish `event` and wait for JetStream's ack; return what the log holds under it.

    With a `msg_id` that JetStream has seen within its de-duplication window the
    publish is a duplicate, and the original event is returned instead.
    """
    bus = gateway.live_bus()
    envelope = make_envelope(
        event, at=datetime.now(UTC), by="gateway", correlation_id=event.aggregate_id()
    )
    headers = inject({"Nats-Msg-Id": msg_id or envelope.id})
    message = Outgoing(subject_for(event), encode(envelope), headers)
    try:
        seq, duplicate = await bus.publish(message, timeout=gateway.settings.publish_timeout_s)
        if duplicate:
            stored = await bus.get(seq)
            recorded = decode(seq, stored.body)
        else:
            recorded = Recorded(seq, envelope, event)
    except (TimeoutError, NatsError, OSError) as exc:
        log.warning("publish of %s failed: %s", event.TYPE, exc)
        raise unavailable(f"the event log (NATS) did not acknowledge the write: {exc}") from exc
    gateway.last_written_seq = max(gateway.last_written_seq, seq)
    return recorded

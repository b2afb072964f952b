"""Write events to the log for a request (`Publisher`, the routes' `PublisherDep`);
refused (503) when the log cannot take them, or (413) when an event is too large for
it. Each write marks the caller's last sequence, which their next read waits for."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import UTC, datetime

from gpuloom.auth import Principal
from gpuloom.bus import EventBus, Outgoing
from gpuloom.bus.errors import BusError
from gpuloom.events import Event, Recorded, decode, encode, make_envelope, subject_for
from gpuloom.telemetry import inject
from services.gateway.eventlog import EventLog
from services.gateway.parts import Gateway
from services.gateway.refusals import Refused, unavailable

log = logging.getLogger(__name__)


class Publisher:
    """What a request writes to the log with: the gateway's bus, its publish timeout, and
    the marks of each caller's last write (`parts.WriteMarks`, for read-your-writes)."""

    __slots__ = ("_events", "_gateway")

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._events = EventLog(gateway)

    async def publish(
        self, event: Event, msg_id: str | None = None, *, principal: Principal
    ) -> Recorded | Refused:
        """Publish `event` and wait for JetStream's ack; return what the log holds under
        it, or the refusal (503: the log is unreachable or did not ack; 413: too large).

        The envelope names `principal`, who asked for it (the authenticated caller).

        With a `msg_id` that JetStream has seen within its de-duplication window the
        publish is a duplicate, and the original event is returned instead.
        """
        bus = self._events.reachable()
        if isinstance(bus, Refused):
            return bus
        envelope = make_envelope(
            event, at=datetime.now(UTC), by="gateway", correlation_id=event.aggregate_id()
        ).model_copy(update={"principal": principal.name})
        headers = inject({"Nats-Msg-Id": msg_id or envelope.id})
        message = Outgoing(subject_for(event), encode(envelope), headers)
        too_large = _size_refusal(bus, message)
        if too_large is not None:
            return too_large
        try:
            timeout = self._gateway.settings.publish_timeout_s
            seq, duplicate = await bus.publish(message, timeout=timeout)
            if duplicate:
                stored = await bus.get(seq)
                recorded = decode(seq, stored.body, subject=stored.subject)
            else:
                recorded = Recorded(seq, envelope, event)
        except (TimeoutError, BusError, OSError) as exc:
            log.warning("publish of %s failed: %s", event.TYPE, exc)
            return unavailable(f"the event log (NATS) did not acknowledge the write: {exc}")
        self._gateway.writes.wrote(principal.name, seq)
        return recorded

    async def publish_batch(
        self, events: Sequence[tuple[Event, str | None]], *, principal: Principal
    ) -> list[Recorded] | Refused:
        """Publish `events` (each with its msg id, or None) pipelined, in order, and wait
        for every ack; return what the log holds under each (the original of a
        duplicate), or the refusal (as `publish`'s).

        Not atomic: when the log fails part-way, the first events may be in it. Msg ids
        derived from an idempotency key make a retry write only the rest.
        """
        bus = self._events.reachable()
        if isinstance(bus, Refused):
            return bus
        now = datetime.now(UTC)
        outgoing, envelopes = [], []
        for event, msg_id in events:
            envelope = make_envelope(
                event, at=now, by="gateway", correlation_id=event.aggregate_id()
            ).model_copy(update={"principal": principal.name})
            message = Outgoing(
                subject_for(event),
                encode(envelope),
                inject({"Nats-Msg-Id": msg_id or envelope.id}),
            )
            too_large = _size_refusal(bus, message)
            if too_large is not None:
                return too_large
            outgoing.append(message)
            envelopes.append(envelope)
        timeout = self._gateway.settings.publish_timeout_s * max(1, len(outgoing) // 100)
        try:
            acks = await bus.publish_acked(outgoing, timeout=timeout)
            recorded = []
            for (seq, duplicate), envelope, (event, _) in zip(acks, envelopes, events, strict=True):
                if duplicate:
                    stored = await bus.get(seq)
                    recorded.append(decode(seq, stored.body, subject=stored.subject))
                else:
                    recorded.append(Recorded(seq, envelope, event))
        except (TimeoutError, BusError, OSError) as exc:
            log.warning("publish of a batch of %d events failed: %s", len(outgoing), exc)
            return unavailable(f"the event log (NATS) did not acknowledge the write: {exc}")
        self._gateway.writes.wrote(principal.name, max((r.seq for r in recorded), default=0))
        return recorded


def _size_refusal(bus: EventBus, message: Outgoing) -> Refused | None:
    """413 for an event the bus would refuse as too large (its `max_payload`).

    Without this, the publish fails like an outage and is answered 503 with
    Retry-After, so a client would retry a request that can never succeed.
    """
    # What the server counts: "NATS/1.0\r\n", "Name: value\r\n" per header, "\r\n", body.
    size = (
        len(message.body)
        + len(b"NATS/1.0\r\n\r\n")
        + sum(len(k.encode()) + len(v.encode()) + 4 for k, v in message.headers.items())
    )
    limit = bus.max_payload
    if limit and size > limit:
        return Refused(413, f"the event would be {size} bytes; the event log takes at most {limit}")
    return None

"""Reads of webhooks: the webhooks the gateway has folded (registered, renewed,
disabled, deleted), and each one's deliveries and their attempts as the webhooks
process recorded them (`webhook_deliveries`, `webhook_attempts`)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select

from gpuloom.state.tenancy import Webhook
from gpuloom.store.models import WebhookAttemptRow, WebhookDeliveryRow
from services.gateway.reads.source import Source


@dataclass(frozen=True, slots=True)
class Attempt:
    """One attempt at a delivery, and what the receiver answered."""

    attempt: int
    at: datetime
    status_code: int | None
    error: str | None
    response: str | None
    duration_ms: int


@dataclass(frozen=True, slots=True)
class Delivery:
    """One event to deliver to a webhook, and its attempts in order."""

    seq: int
    event_id: str
    event_type: str
    status: str
    attempts: list[Attempt]
    next_at: datetime | None
    created_at: datetime
    done_at: datetime | None


class WebhookReads:
    __slots__ = ("_source",)

    def __init__(self, source: Source) -> None:
        self._source = source

    def hooks(self) -> dict[str, Webhook]:
        """Every webhook by id (none before the gateway read the log)."""
        state = self._source.folded()
        return state.webhooks if state is not None else {}

    async def deliveries(self, hook_id: str, status: str | None, limit: int) -> list[Delivery]:
        """The webhook's latest `limit` deliveries (of `status`, if given), newest first."""
        query = select(WebhookDeliveryRow).where(WebhookDeliveryRow.webhook_id == hook_id)
        if status is not None:
            query = query.where(WebhookDeliveryRow.status == status)
        async with self._source.session() as session:
            rows = (
                (await session.execute(query.order_by(WebhookDeliveryRow.seq.desc()).limit(limit)))
                .scalars()
                .all()
            )
            found = await session.execute(
                select(WebhookAttemptRow)
                .where(WebhookAttemptRow.delivery_id.in_([row.id for row in rows]))
                .order_by(WebhookAttemptRow.delivery_id, WebhookAttemptRow.attempt)
            )
            attempts: dict[int, list[Attempt]] = {}
            for row in found.scalars().all():
                attempts.setdefault(row.delivery_id, []).append(
                    Attempt(
                        row.attempt,
                        row.at,
                        row.status_code,
                        row.error,
                        row.response,
                        row.duration_ms,
                    )
                )
        return [
            Delivery(
                seq=row.seq,
                event_id=row.event_id,
                event_type=row.event_type,
                status=row.status,
                attempts=attempts.get(row.id, []),
                next_at=row.next_at if row.status == "pending" else None,
                created_at=row.created_at,
                done_at=row.done_at,
            )
            for row in rows
        ]

"""Delivering the outbox: one worker per webhook sends its pending deliveries one at a
time, in log order, each until it is delivered, given up, or the webhook stops.

A failed attempt is tried again after the next wait of `Settings.webhook_retry_s`
(or what the receiver's `Retry-After` asks for); after the last one the delivery is
`failed` and the next one goes. A 410 Gone disables the webhook (event WebhookDisabled):
its pending deliveries are `dropped`. Every attempt and its answer is a row of
`webhook_attempts` (`GET /v1/webhooks/{id}/deliveries`).

A delivery is claimed (`claimed_until`) before it is attempted, so that a second
replica of the webhooks process leaves it alone; a claim of a replica that died
expires.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from itertools import takewhile
from typing import Any

from sqlalchemy import delete, or_, select, update
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.config import Settings
from gpuloom.state import ClusterState
from gpuloom.state.tenancy import Webhook
from gpuloom.store.models import WebhookAttemptRow, WebhookDeliveryRow
from gpuloom.tasks import cancel_and_wait
from gpuloom.telemetry.metrics import WEBHOOK_ATTEMPTS
from gpuloom.webhooks.policy import next_delay, outcome, retry_after_s
from gpuloom.webhooks.sealing import Sealer, SealError
from gpuloom.webhooks.signing import signed_headers
from gpuloom.webhooks.transport import Answer, send
from services.webhooks.lanes import Lanes
from services.webhooks.outbox import Disable

log = logging.getLogger(__name__)

#: Finished deliveries kept per webhook (the older ones are removed, every
#: `PRUNE_EVERY` deliveries a worker finishes).
KEPT = 1000
PRUNE_EVERY = 200
#: Deliveries claimed and recorded together.
BATCH = 50
#: How often a worker looks again without being woken (a retry's time, a claim expiring).
IDLE_S = 1.0


class Contended(Exception):
    """Another replica claimed some of the deliveries."""


class Sender:
    def __init__(
        self,
        settings: Settings,
        sessions: async_sessionmaker[Any],
        state: Callable[[], ClusterState],
        covered: Callable[[], int],
        sealer: Sealer,
        disable: Disable,
    ) -> None:
        self.settings = settings
        self.sessions = sessions
        self.state = state
        self.covered = covered
        self.sealer = sealer
        self.disable = disable
        self.wake = asyncio.Condition()
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._stop = asyncio.Event()
        self._finished = 0
        self._waking: set[asyncio.Task[None]] = set()
        self.lanes = Lanes(settings.webhook_max_in_flight, settings.webhook_max_in_flight_per_owner)

    def notify(self) -> None:
        async def wake() -> None:
            async with self.wake:
                self.wake.notify_all()

        task = asyncio.get_running_loop().create_task(wake())
        self._waking.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self._waking.discard)

    async def run(self, stop: asyncio.Event) -> None:
        """Keep one worker per delivering webhook; tidy up after those that left."""
        self._stop = stop
        try:
            while not stop.is_set():
                await self._sync_workers()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), IDLE_S)
        finally:
            await cancel_and_wait(*self._workers.values())
            await self.lanes.close_all()

    async def _sync_workers(self) -> None:
        hooks = self.state().webhooks
        live = {i for i, hook in hooks.items() if hook.disabled is None}
        for hook_id in sorted(set(self._workers) - live):
            await cancel_and_wait(self._workers.pop(hook_id))
            await self.lanes.close(hook_id)
            await self._retire(hook_id, deleted=hook_id not in hooks)
        for hook_id in sorted(live - set(self._workers)):
            self._workers[hook_id] = asyncio.create_task(self._work(hook_id))

    async def _retire(self, hook_id: str, *, deleted: bool) -> None:
        """A deleted webhook's deliveries go; a disabled one's pending ones are dropped."""
        try:
            async with self.sessions() as session, session.begin():
                if deleted:
                    ids = select(WebhookDeliveryRow.id).where(
                        WebhookDeliveryRow.webhook_id == hook_id
                    )
                    await session.execute(
                        delete(WebhookAttemptRow).where(WebhookAttemptRow.delivery_id.in_(ids))
                    )
                    await session.execute(
                        delete(WebhookDeliveryRow).where(WebhookDeliveryRow.webhook_id == hook_id)
                    )
                else:
                    await session.execute(
                        update(WebhookDeliveryRow)
                        .where(
                            WebhookDeliveryRow.webhook_id == hook_id,
                            WebhookDeliveryRow.status == "pending",
                        )
                        .values(status="dropped", done_at=datetime.now(UTC))
                    )
        except Exception:
            log.exception("webhooks: could not tidy the deliveries of %s", hook_id)

    async def _work(self, hook_id: str) -> None:
        while not self._stop.is_set():
            try:
                wait = await self._step(hook_id)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhooks: delivering to %s failed; trying again", hook_id)
                wait = IDLE_S
            if wait > 0:
                async with self.wake:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self.wake.wait(), min(wait, IDLE_S))

    async def _step(self, hook_id: str) -> float:
        """Attempt the webhook's next deliveries that are due, in log order, until one
        fails; the seconds to wait before the next step (0: go on at once).

        Up to `BATCH` deliveries are claimed at once and their outcomes written in one
        transaction: three statements for a batch, not three for each delivery. A
        process that dies within a batch sends the ones it had not recorded again
        (at least once)."""
        hook = self.state().webhooks.get(hook_id)
        if hook is None or hook.disabled is not None:
            return IDLE_S
        now = datetime.now(UTC)
        async with self.sessions() as session:
            found = await session.execute(
                select(WebhookDeliveryRow)
                .where(
                    WebhookDeliveryRow.webhook_id == hook_id,
                    WebhookDeliveryRow.status == "pending",
                    WebhookDeliveryRow.seq <= self.covered(),
                )
                .order_by(WebhookDeliveryRow.seq)
                .limit(BATCH)
            )
            rows = list(found.scalars().all())
        if not rows:
            return IDLE_S
        if rows[0].next_at > now:
            return float((rows[0].next_at - now).total_seconds())
        due = list(takewhile(lambda row: row.next_at <= now, rows))
        async with self.lanes.slot(hook.owner):  # owner's first, then a shared one
            answers = await self._claim_and_send(hook, due)
        if answers is None:
            return IDLE_S
        ids = [row.id for row in due]
        await self._record(hook, answers, unsent=ids[len(answers) :])
        return 0.0

    async def _claim_and_send(
        self, hook: Webhook, due: list[WebhookDeliveryRow]
    ) -> list[tuple[WebhookDeliveryRow, Answer]] | None:
        """Claim `due`, then attempt them in order until one fails; None: another
        replica holds some of them."""
        now = datetime.now(UTC)
        ids = [row.id for row in due]
        claim_until = now + timedelta(seconds=self.settings.webhook_timeout_s * len(due) + 30)
        try:
            async with self.sessions() as session, session.begin():
                claimed = await session.execute(
                    update(WebhookDeliveryRow)
                    .where(
                        WebhookDeliveryRow.id.in_(ids),
                        WebhookDeliveryRow.status == "pending",
                        or_(
                            WebhookDeliveryRow.claimed_until.is_(None),
                            WebhookDeliveryRow.claimed_until < now,
                        ),
                    )
                    .values(claimed_until=claim_until)
                )
                if claimed.rowcount != len(ids):
                    raise Contended  # another replica has some: leave them all (rolled back)
        except Contended:
            return None
        answers: list[tuple[WebhookDeliveryRow, Answer]] = []
        for row in due:
            answer = await self._attempt(hook, row)
            answers.append((row, answer))
            if answer.status_code is None or outcome(answer.status_code) != "delivered":
                break  # the next ones wait for this one (log order)
        return answers

    async def _attempt(self, hook: Webhook, row: WebhookDeliveryRow) -> Answer:
        try:
            secret = self.sealer.unseal(hook.secret_sealed, hook.webhook_id)
        except SealError as exc:
            return Answer(None, f"not signed: {exc}", None, None, 0)
        body = row.body.encode()
        headers = signed_headers(secret, row.event_id, int(datetime.now(UTC).timestamp()), body)
        return await send(
            self.lanes.client(hook.webhook_id),
            hook.url,
            body,
            headers,
            allow_private=self.settings.webhook_allow_private,
            timeout_s=self.settings.webhook_timeout_s,
        )

    async def _record(
        self, hook: Webhook, answers: list[tuple[WebhookDeliveryRow, Answer]], unsent: list[int]
    ) -> None:
        """Write the attempts and where each delivery stands; release the unsent ones."""
        now = datetime.now(UTC)
        gone = False
        async with self.sessions() as session, session.begin():
            for row, answer in answers:
                values = self._after(row, answer, now)
                gone = gone or (
                    answer.status_code is not None and outcome(answer.status_code) == "gone"
                )
                session.add(
                    WebhookAttemptRow(
                        delivery_id=row.id,
                        attempt=values["attempts"],
                        at=now,
                        status_code=answer.status_code,
                        error=answer.error,
                        response=answer.response,
                        duration_ms=answer.duration_ms,
                    )
                )
                await session.execute(
                    update(WebhookDeliveryRow)
                    .where(WebhookDeliveryRow.id == row.id)
                    .values(**values)
                )
            if unsent:
                await session.execute(
                    update(WebhookDeliveryRow)
                    .where(WebhookDeliveryRow.id.in_(unsent))
                    .values(claimed_until=None)
                )
        if gone:
            await self.disable(hook.webhook_id, "the receiver answered 410 Gone")
        self._finished += len(answers)
        if self._finished >= PRUNE_EVERY:
            self._finished = 0
            await self._prune(hook.webhook_id)

    def _after(self, row: WebhookDeliveryRow, answer: Answer, now: datetime) -> dict[str, Any]:
        """The delivery's columns after one attempt: delivered, failed, or due again."""
        attempts = row.attempts + 1
        result = outcome(answer.status_code) if answer.status_code is not None else "retry"
        values: dict[str, Any] = {"attempts": attempts, "claimed_until": None}
        if result == "delivered":
            values |= {"status": "delivered", "done_at": now}
        elif result == "gone":
            values |= {"status": "failed", "done_at": now}
        else:
            delay = next_delay(
                attempts, self.settings.webhook_retry_s, retry_after_s(answer.retry_after, now)
            )
            if delay is None:
                values |= {"status": "failed", "done_at": now}
            else:
                values["next_at"] = now + timedelta(seconds=delay)
        WEBHOOK_ATTEMPTS.labels(values.get("status", "retry")).inc()
        return values

    async def _prune(self, hook_id: str) -> None:
        """Keep the latest `KEPT` finished deliveries of the webhook."""
        async with self.sessions() as session, session.begin():
            cutoff = (
                select(WebhookDeliveryRow.seq)
                .where(WebhookDeliveryRow.webhook_id == hook_id)
                .order_by(WebhookDeliveryRow.seq.desc())
                .offset(KEPT)
                .limit(1)
            )
            old = select(WebhookDeliveryRow.id).where(
                WebhookDeliveryRow.webhook_id == hook_id,
                WebhookDeliveryRow.status != "pending",
                WebhookDeliveryRow.seq <= cutoff.scalar_subquery(),
            )
            await session.execute(
                delete(WebhookAttemptRow).where(WebhookAttemptRow.delivery_id.in_(old))
            )
            await session.execute(delete(WebhookDeliveryRow).where(WebhookDeliveryRow.id.in_(old)))

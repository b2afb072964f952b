"""The webhooks' outbox: a durable JetStream consumer of the log, `webhooks`, whose
events are written into `webhook_deliveries` (one row per webhook that gets the
event) before they are acknowledged.

A process that stops between the two gets the unacknowledged events again and the
rows already written are kept (their key is the webhook and the sequence), so a restart
(a kill -9 included) neither loses an event nor repeats one, and the consumer resumes
where it was, not at the log's start (no flood of old events). `covered_seq` is the
consumer's ack floor: every event up to it has its rows, so a webhook's deliveries go
out in log order up to it (`sender`), whichever replica wrote them.

Which webhooks get an event is decided on the process's own fold as of that event
(the outbox waits for the fold to hold it: `services.webhooks.fold`): a webhook gets
what was written after its registration (`gpuloom.webhooks.policy.gets`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

import orjson
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.auth.policy import Accounts
from gpuloom.auth.visibility import Owners
from gpuloom.bus import EventBus, Incoming
from gpuloom.events import Event, MalformedEvent, decode
from gpuloom.events.cloud import to_cloudevent
from gpuloom.state import ClusterState
from gpuloom.store.models import WebhookAttemptRow, WebhookDeliveryRow
from gpuloom.store.upsert import insert_ignore
from gpuloom.webhooks.policy import backlog_problem, gets

log = logging.getLogger(__name__)

#: The durable consumer's name (`gpuloom.bus.jsapi.DURABLES`: the webhooks
#: identity's own).
DURABLE = "webhooks"
#: Events taken per fetch (and unacknowledged at most).
BATCH = 256
#: How long the server waits for an ack before it sends an event again (a process
#: killed with a batch taken: its successor gets the batch after this).
ACK_WAIT_S = 10.0
#: How long a batch waits for the fold to hold it (then it is left unacked).
FOLD_WAIT_S = 5.0
#: Pending deliveries one webhook may have before it is disabled if its receiver is
#: failing too (`policy.backlog_problem`; `Settings.webhook_max_backlog`).
MAX_BACKLOG = 10_000
#: How long the receiver must have failed every attempt (none succeeding since).
BACKLOG_GRACE_S = 3600.0

Disable = Callable[[str, str], Awaitable[None]]


class Folded(Protocol):
    """A fold of the log the outbox decides on (`services.webhooks.fold.Fold`)."""

    @property
    def state(self) -> ClusterState: ...

    async def wait_for(self, seq: int, timeout: float) -> bool:
        """Wait until the state holds the events up to `seq`; False on timeout."""
        ...


@dataclass(frozen=True, slots=True)
class Made:
    """One event of the log as a webhook gets it."""

    event: Event
    #: The event's own id (its CloudEvent `id`: the `webhook-id` header).
    event_id: str
    #: Its CloudEvent JSON (one line): the body POSTed.
    cloud: str


def made_of(message: Incoming) -> Made | None:
    """The event of `message` as its CloudEvent; None: malformed (every reader of the
    log skips it, and the fold dead-letters it)."""
    try:
        recorded = decode(message.seq, message.body, message.stored_at, subject=message.subject)
    except MalformedEvent:
        return None
    cloud = orjson.dumps(to_cloudevent(recorded)).decode()
    return Made(recorded.event, recorded.envelope.id, cloud)


class Outbox:
    def __init__(
        self,
        bus: EventBus,
        fold: Folded,
        sessions: async_sessionmaker[Any],
        owners: Owners,
        accounts: Callable[[], Accounts],
        notify: Callable[[], None],
        disable: Disable,
        *,
        max_backlog: int = MAX_BACKLOG,
        backlog_grace_s: float = BACKLOG_GRACE_S,
    ) -> None:
        self.bus = bus
        self.max_backlog = max_backlog
        self.backlog_grace_s = backlog_grace_s
        self.fold = fold
        self.sessions = sessions
        self.owners = owners
        self.accounts = accounts
        self.notify = notify
        self.disable = disable
        #: Every event up to this sequence has its delivery rows.
        self.covered_seq = 0
        self.consumer = bus.durable(DURABLE, batch=BATCH, ack_wait_s=ACK_WAIT_S)

    async def ensure_consumer(self) -> None:
        """Make the durable consumer when missing: from just after the oldest webhook's
        registration (they get nothing older), or the log's end when there is none."""
        floor = await self.consumer.floor()
        if floor is not None:
            self.covered_seq = floor
            return
        hooks = self.fold.state.webhooks
        start = min((h.registered_seq for h in hooks.values()), default=self.fold.state.seq)
        await self.consumer.make(after_seq=start)
        self.covered_seq = start
        log.info("webhooks: durable consumer %s made, from seq %d", DURABLE, start + 1)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.ensure_consumer()
                try:
                    while not stop.is_set():
                        await self.take(await self.consumer.fetch(timeout=1.0))
                finally:
                    await self.consumer.close()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhooks: the outbox stopped; starting again")
                await asyncio.sleep(1.0)

    async def take(self, batch: list[Incoming]) -> None:
        """Write the rows of `batch`, then acknowledge it and move `covered_seq`."""
        if not batch:
            return
        last = batch[-1].seq
        if not await self.fold.wait_for(last, timeout=FOLD_WAIT_S):
            log.warning("webhooks: seq %d not folded yet; the batch comes again", last)
            return
        now = datetime.now(UTC)
        rows: list[dict[str, Any]] = []
        state, accounts = self.fold.state, self.accounts()
        # as of the batch's last event (or later), which the fold holds
        hooks = [hook for _, hook in sorted(state.webhooks.items())]
        for incoming in batch:
            seq = incoming.seq
            made = made_of(incoming)
            if made is None:
                continue
            event = made.event
            self.owners.learn(event)
            if not hooks:
                continue
            job_owner = await self.owners.of(event)
            for hook in hooks:
                if gets(hook, seq, event, job_owner, accounts, incoming.stored_at or now):
                    rows.append(
                        {
                            "webhook_id": hook.webhook_id,
                            "seq": seq,
                            "event_id": made.event_id,
                            "event_type": event.TYPE,
                            "body": made.cloud,
                            "status": "pending",
                            "attempts": 0,
                            "next_at": now,
                            "created_at": now,
                        }
                    )
        if rows:
            async with self.sessions() as session, session.begin():
                await insert_ignore(session, WebhookDeliveryRow, rows, ("webhook_id", "seq"))
        await self.consumer.ack(batch)
        await self._read_floor()
        if rows:
            self.notify()
            await self._check_backlogs(sorted({row["webhook_id"] for row in rows}))

    async def _read_floor(self) -> None:
        """`covered_seq` from the consumer's ack floor: an event a replica that died had
        taken is below it until it comes again, and nothing after it goes out before."""
        floor = await self.consumer.floor()
        self.covered_seq = max(self.covered_seq, floor or 0)

    async def _check_backlogs(self, hook_ids: list[str]) -> None:
        """Disable the webhooks among `hook_ids` whose backlog is over the limit while
        their receiver fails (`policy.backlog_problem`). Asked when rows are written:
        a backlog grows only then."""
        async with self.sessions() as session:
            found = await session.execute(
                select(WebhookDeliveryRow.webhook_id, func.count())
                .where(
                    WebhookDeliveryRow.status == "pending",
                    WebhookDeliveryRow.webhook_id.in_(hook_ids),
                )
                .group_by(WebhookDeliveryRow.webhook_id)
            )
            counts = dict(found.tuples().all())
            over = sorted(h for h, count in counts.items() if count > self.max_backlog)
            failing = {hook_id: await _failing_since(session, hook_id) for hook_id in over}
        now = datetime.now(UTC)
        for hook_id in over:
            problem = backlog_problem(
                counts[hook_id], failing[hook_id], now, self.max_backlog, self.backlog_grace_s
            )
            if problem is not None:
                await self.disable(hook_id, problem)


async def _failing_since(session: Any, hook_id: str) -> datetime | None:
    """Since when the webhook's receiver has failed every attempt: its first failed
    attempt after its last successful one; None when it has not failed since.

    Read over all of the webhook's attempts, not its oldest pending delivery's: a
    delivery given up after its last retry makes the next one the oldest, and a
    receiver that fails everything must not look new again each time."""
    attempts = (
        select(WebhookAttemptRow.at, WebhookAttemptRow.status_code)
        .join(WebhookDeliveryRow, WebhookDeliveryRow.id == WebhookAttemptRow.delivery_id)
        .where(WebhookDeliveryRow.webhook_id == hook_id)
        .subquery()
    )
    succeeded = attempts.c.status_code.between(200, 299)
    last_ok = (await session.execute(select(func.max(attempts.c.at)).where(succeeded))).scalar()
    failed = select(func.min(attempts.c.at)).where(~succeeded | attempts.c.status_code.is_(None))
    if last_ok is not None:
        failed = failed.where(attempts.c.at > last_ok)
    first: datetime | None = (await session.execute(failed)).scalar()
    if first is not None and first.tzinfo is None:  # SQLite keeps no zone: they are UTC
        first = first.replace(tzinfo=UTC)
    return first

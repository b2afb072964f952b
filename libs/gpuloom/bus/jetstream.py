"""The JetStream adapter: the stream, publishing with `Nats-Msg-Id`, replay and consumers.

Thin by design: it moves bytes and headers. Encoding is `gpuloom.events.codec`,
meaning is `gpuloom.state`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import nats
from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import StreamInfo
from nats.js.errors import NotFoundError

from gpuloom.bus.deadletters import DeadLetters, read_dead_letters
from gpuloom.bus.durable import DurableConsumer
from gpuloom.bus.follower import follow_pull
from gpuloom.bus.messages import Incoming, Outgoing, Received, StreamFigures
from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.bus.streams import Expected, check_streams, ensure_streams, require_stream
from gpuloom.events.subjects import ALL_EVENTS

log = logging.getLogger(__name__)


class EventBus:
    """A connection to NATS and the gpuloom stream (see `gpuloom.bus.streams`)."""

    def __init__(self, nc: NatsClient, stream: str) -> None:
        self.nc = nc
        self.js: JetStreamContext = nc.jetstream()
        self.stream = stream
        self._dead_letters: dict[str, DeadLetters] = {}

    @classmethod
    async def connect(
        cls,
        url: str,
        stream: str,
        *,
        name: str,
        dedup_window_s: float | None = None,
        replicas: int | None = None,
        create: bool = True,
        connect_timeout: float = 5,
        **options: object,
    ) -> EventBus:
        """Connect; with `create`, make the log (and its dead-letter stream) if missing.

        An existing stream is never changed: what differs from `dedup_window_s` or
        `replicas` (None: no expectation) is logged once. Without `create` (read-only
        tools) a missing log raises `StreamMissingError`.
        """

        async def on_error(exc: Exception) -> None:
            log.warning("nats error: %s", exc)

        nc = await nats.connect(
            url,
            name=name,
            connect_timeout=connect_timeout,
            max_reconnect_attempts=-1,
            reconnect_time_wait=0.5,
            error_cb=on_error,
            **options,
        )
        bus = cls(nc, stream)
        try:
            if create:
                await bus.ensure_stream(dedup_window_s, replicas)
            else:
                await require_stream(bus.js, stream, url)
        except BaseException:
            await nc.close()
            raise
        return bus

    async def ensure_stream(
        self, dedup_window_s: float | None = None, replicas: int | None = None
    ) -> None:
        """Create the log and its dead-letter stream when missing; never update them."""
        await ensure_streams(self.js, self.stream, Expected(dedup_window_s, replicas))

    async def check_stream(
        self, dedup_window_s: float | None = None, replicas: int | None = None
    ) -> None:
        """Log (once) how the log differs from these expectations; change nothing."""
        await check_streams(self.js, self.stream, Expected(dedup_window_s, replicas))

    def dead_letters(self, service: str) -> DeadLetters:
        """The dead-letter outbox of `service` on this bus (one per service)."""
        if service not in self._dead_letters:
            self._dead_letters[service] = DeadLetters(self.js, self.stream, service)
        return self._dead_letters[service]

    async def close(self, drain_timeout_s: float = 3.0) -> None:
        """Drain (flush what is in flight, end subscriptions), then close regardless."""
        if self.nc.is_closed:
            return
        for outbox in self._dead_letters.values():
            await outbox.flush(1.0)
        try:
            await asyncio.wait_for(self.nc.drain(), drain_timeout_s)
        except Exception as exc:  # a stuck drain must not keep the process alive
            log.warning("drain did not finish (%s): closing", exc or type(exc).__name__)
        if not self.nc.is_closed:
            await self.nc.close()

    @property
    def connected(self) -> bool:
        return self.nc.is_connected

    @property
    def max_payload(self) -> int:
        """The largest message the server takes (its `max_payload`, 1 MiB by default)."""
        return int(self.nc.max_payload)

    async def subjects(self, pattern: str) -> list[str]:
        """The subjects of the stream's messages that `pattern` matches, sorted (a
        stream that keeps the latest per subject: what it holds)."""
        info = await self.js.stream_info(self.stream, subjects_filter=pattern)
        return sorted(info.state.subjects or {})

    async def purge_before(self, seq: int) -> None:
        """Drop every message of the stream before `seq` (the log's start, archived)."""
        await self.js.purge_stream(self.stream, seq=seq)

    def durable(self, name: str, *, batch: int, ack_wait_s: float) -> DurableConsumer:
        """The durable consumer `name` of the stream (`gpuloom.bus.durable`)."""
        return DurableConsumer(self.js, self.stream, name, batch=batch, ack_wait_s=ack_wait_s)

    def snapshot_store(
        self,
        service: str,
        *,
        keep: int = 2,
        replicas: int = 1,
        bucket: str | None = None,
        create: bool = False,
    ) -> SnapshotStore:
        """`service`'s snapshots (`gpuloom.bus.snapshots`)."""
        return SnapshotStore(
            self.js, service, keep=keep, replicas=replicas, bucket=bucket, create=create
        )

    async def dead_letter_page(self, limit: int) -> tuple[int, list[dict[str, Any]]]:
        """How many dead letters the stream's DLQ holds, and the newest `limit`."""
        return await read_dead_letters(self.js, self.stream, limit)

    def on_stream(self, stream: str) -> EventBus:
        """The same connection, on another stream (the per-node view's)."""
        return EventBus(self.nc, stream)

    # --- core NATS: heartbeats, syncs, requests (messages that are not the log's) ------

    async def send(self, subject: str, body: bytes) -> None:
        """Publish on core NATS: no stream keeps it, nobody acknowledges it."""
        await self.nc.publish(subject, body)

    async def request(self, subject: str, body: bytes, timeout: float) -> bytes:
        """Ask whoever serves `subject` and wait up to `timeout` for the answer."""
        reply = await self.nc.request(subject, body, timeout=timeout)
        return bytes(reply.data)

    def new_inbox(self) -> str:
        """A subject of this connection's own inbox (its identity's: `inbox_prefix`)."""
        return str(self.nc.new_inbox())

    async def serve(
        self, subject: str, handler: Callable[[Received], Awaitable[None]]
    ) -> Callable[[], Awaitable[None]]:
        """Hand `handler` every core message on `subject` (wildcards allowed); returns
        what stops it."""

        async def callback(msg: Msg) -> None:
            respond = msg.respond if msg.reply else None
            await handler(Received(msg.subject, msg.data, respond))

        subscription = await self.nc.subscribe(subject, cb=callback)
        return subscription.unsubscribe

    async def last_seq(self) -> int:
        return (await self.stream_figures()).last_seq

    async def stream_figures(self) -> StreamFigures:
        info = await self.js.stream_info(self.stream)
        state = info.state
        return StreamFigures(
            messages=int(state.messages),
            bytes=int(state.bytes),
            first_seq=int(state.first_seq),
            last_seq=int(state.last_seq),
            created=info.created.isoformat() if info.created else "",
            max_bytes=max(0, int(info.config.max_bytes or 0)),
            max_messages=max(0, int(info.config.max_msgs or 0)),
            replicas_wanted=int(info.config.num_replicas or 1),
            replicas_current=_replicas_now(info),
        )

    async def publish(self, message: Outgoing, timeout: float = 5.0) -> tuple[int, bool]:
        """Publish and wait for the ack; return (stream sequence, was it a duplicate)."""
        ack = await self.js.publish(
            message.subject,
            message.body,
            timeout=timeout,
            stream=self.stream,
            headers=message.headers,
        )
        return int(ack.seq), bool(ack.duplicate)

    async def publish_many(self, messages: Sequence[Outgoing], timeout: float = 10.0) -> list[int]:
        """Publish a batch with pipelined acks; return their sequences in order.

        Uses `publish_async`, whose futures never resolve on a server-side
        rejection (nats.py#985), so every future is awaited with a timeout.
        None of gpuloom's pipelined publishes carries an expected-sequence header.
        """
        return [seq for seq, _ in await self.publish_acked(messages, timeout)]

    async def publish_acked(
        self, messages: Sequence[Outgoing], timeout: float = 10.0
    ) -> list[tuple[int, bool]]:
        """`publish_many`, telling for each message whether the log already had it (a
        duplicate of its `Nats-Msg-Id` within the window): (sequence, duplicate)."""
        futures = [
            await self.js.publish_async(m.subject, m.body, stream=self.stream, headers=m.headers)
            for m in messages
        ]
        acks = await asyncio.wait_for(asyncio.gather(*futures), timeout)
        return [(int(ack.seq), bool(ack.duplicate)) for ack in acks]

    async def get(self, seq: int) -> Incoming:
        msg = await self.js.get_msg(self.stream, seq=seq, direct=True)
        return Incoming(
            int(msg.seq or seq), msg.subject or "", msg.data or b"", dict(msg.headers or {}), 0
        )

    async def follow(
        self,
        on_message: Callable[[Incoming], Awaitable[None]],
        *,
        from_seq: int = 1,
        subjects: str = ALL_EVENTS,
        consumer: str | None = None,
    ) -> Callable[[], Awaitable[None]]:
        """Deliver every message from `from_seq` on, in order, then keep following.

        A pull consumer of the follower's own (`gpuloom.bus.follower`): it replays,
        survives reconnects and server restarts, and holds at most a batch of
        messages besides what `on_message` keeps. `on_message` may wait (a full inbox,
        `INBOX_LIMIT`): the next message is delivered once it returns, and the server
        keeps the rest. `consumer`: the consumer's fixed name (an agent's view); None:
        a fresh one. Returns a function that stops it.
        """

        async def callback(msg: Msg) -> None:
            meta = msg.metadata
            await on_message(
                Incoming(
                    seq=int(meta.sequence.stream),
                    subject=msg.subject,
                    body=msg.data,
                    headers=dict(msg.headers or {}),
                    pending=int(meta.num_pending),
                    stored_at=meta.timestamp,
                )
            )

        return await follow_pull(
            self.nc, self.js, self.stream, subjects, from_seq, callback, name=consumer
        )

    async def read_subject(self, subjects: str, timeout: float = 2.0) -> list[Incoming]:
        """Every message on `subjects` so far (an audit trail), read with an ordered consumer."""
        info = await self.js.stream_info(self.stream, subjects_filter=subjects)
        expected = sum((info.state.subjects or {}).values())
        if expected == 0:
            return []
        got: list[Incoming] = []
        sub = await self.js.subscribe(subjects, stream=self.stream, ordered_consumer=True)
        try:
            while len(got) < expected:
                msg = await sub.next_msg(timeout=timeout)
                got.append(
                    Incoming(
                        int(msg.metadata.sequence.stream),
                        msg.subject,
                        msg.data,
                        dict(msg.headers or {}),
                        int(msg.metadata.num_pending),
                        msg.metadata.timestamp,
                    )
                )
                if msg.metadata.num_pending == 0:
                    break
        finally:
            await sub.unsubscribe()
        return got

    async def drop_durable(self, durable: str) -> bool:
        """Delete the durable consumer `durable` of the log if it exists (one an older
        version kept, `gpuloom.bus.jsapi.DURABLES`); True when one was deleted."""
        try:
            return bool(await self.js.delete_consumer(self.stream, durable))
        except NotFoundError:
            return False


def _replicas_now(info: StreamInfo) -> int:
    """The copies of the stream the server reports: its leader and each replica it lists
    as current (one on a server without a cluster, which reports none)."""
    cluster = info.cluster
    if cluster is None or not cluster.leader:
        return 1
    return 1 + sum(1 for peer in cluster.replicas or () if peer.current and not peer.offline)

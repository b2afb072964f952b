"""A durable consumer of the log: what a process that must take every event once, across
restarts and replicas, pulls from (the webhooks' outbox). The server keeps its place;
an event taken and not acknowledged within `ack_wait_s` comes again (a process killed
with a batch in hand: its successor, or another replica, gets the batch).

Every other reader follows the log with a consumer of its own that goes with it
(`gpuloom.bus.follower`); a durable one belongs to one identity (`jsapi.DURABLES`).
"""

from __future__ import annotations

from collections.abc import Sequence

from nats.aio.msg import Msg
from nats.errors import TimeoutError as NatsTimeout
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, ConsumerInfo, DeliverPolicy
from nats.js.errors import NotFoundError

from gpuloom.bus.messages import Incoming
from gpuloom.events.subjects import ALL_EVENTS


class DurableConsumer:
    """The durable consumer `name` of `stream`: made once, then pulled in batches."""

    def __init__(
        self,
        js: JetStreamContext,
        stream: str,
        name: str,
        *,
        batch: int,
        ack_wait_s: float,
        subjects: str = ALL_EVENTS,
    ) -> None:
        self.js, self.stream, self.name = js, stream, name
        self.batch, self.ack_wait_s, self.subjects = batch, ack_wait_s, subjects
        self._subscription: JetStreamContext.PullSubscription | None = None
        #: The messages of the batch in hand, by sequence, to acknowledge.
        self._taken: dict[int, Msg] = {}

    async def floor(self) -> int | None:
        """The sequence up to which every event is acknowledged; None: no consumer yet."""
        try:
            info = await self.js.consumer_info(self.stream, self.name)
        except NotFoundError:
            return None
        return _floor(info)

    async def make(self, after_seq: int) -> None:
        """Make the consumer, delivering from `after_seq + 1` on, at most a batch in hand."""
        config = ConsumerConfig(
            name=self.name,
            durable_name=self.name,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=after_seq + 1,
            ack_policy=AckPolicy.EXPLICIT,
            ack_wait=self.ack_wait_s,
            max_ack_pending=self.batch,
            filter_subject=self.subjects,
        )
        await self.js.add_consumer(self.stream, config=config)

    async def fetch(self, timeout: float) -> list[Incoming]:
        """The next batch (empty when none came within `timeout`); binds on first use."""
        if self._subscription is None:
            self._subscription = await self.js.pull_subscribe_bind(
                durable=self.name, stream=self.stream
            )
        try:
            batch = await self._subscription.fetch(self.batch, timeout=timeout)
        except (TimeoutError, NatsTimeout):
            return []
        taken = []
        for msg in batch:
            meta = msg.metadata
            seq = int(meta.sequence.stream)
            self._taken[seq] = msg
            taken.append(Incoming(seq, msg.subject, msg.data, {}, 0, meta.timestamp))
        return taken

    async def ack(self, batch: Sequence[Incoming]) -> None:
        """Acknowledge `batch` (the last one waits for the server's word)."""
        msgs = [self._taken.pop(message.seq) for message in batch]
        for msg in msgs[:-1]:
            await msg.ack()
        if msgs:
            await msgs[-1].ack_sync()

    async def close(self) -> None:
        """Unbind (the consumer and its place stay on the server)."""
        subscription, self._subscription = self._subscription, None
        self._taken.clear()  # not acknowledged: they come again after `ack_wait_s`
        if subscription is not None:
            await subscription.unsubscribe()


def _floor(info: ConsumerInfo) -> int:
    floor = info.ack_floor
    return int(floor.stream_seq or 0) if floor is not None else 0

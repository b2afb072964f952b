"""Following the log in order with a pull consumer: the server sends only what the
follower asked for, so a follower that folds slower than the log is delivered holds
a bounded number of messages, and the server keeps the rest.

An ordered *push* consumer, used before, is flow controlled by the client library's
own queue: nats-py answered the server's flow control as messages reached its queue,
not as the process took them, and a follower replaying a long log into a database
(the gateway's first start) held the whole log in that queue (docs/benchmarks.md).

The follower keeps one pull request open on an ephemeral consumer of its own
(`AckPolicy.NONE`, in memory, deleted by the server once unused): up to `BATCH`
events, lingering until they come (so a new event is delivered at once), with idle
heartbeats. When the batch is delivered, or the request expires, it asks again.

The consumer does not wait for acknowledgements, so a message the server sent while
the connection was down is lost in transit. The follower therefore makes a new
consumer, from the next sequence it has not delivered, whenever the connection was
re-established, a message's consumer sequence skips one, it hears nothing (not even
a heartbeat) for `DEAD_AFTER_S`, or its consumer is gone (nats-server restarted, a
leader changed): nothing is lost, skipped or repeated.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NatsClient
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from nats.js.errors import NotFoundError
from nats.nuid import NUID

from gpuloom.tasks import cancel_and_wait

log = logging.getLogger(__name__)

#: Events one pull request asks for: what a follower may hold besides its own inbox.
BATCH = 256
#: How long one pull request lingers for new events before it is renewed.
EXPIRES_S = 30.0
#: The server's heartbeat while a request lingers with nothing to deliver.
HEARTBEAT_S = 5.0
#: Silence (no event, no heartbeat, no status) after which the consumer is taken for
#: lost and made anew from the next sequence.
DEAD_AFTER_S = 2.5 * HEARTBEAT_S
#: Unused this long, the server deletes the follower's consumer (a process that died).
INACTIVE_S = 60.0
#: How long to wait before trying again to make a consumer (the server is away).
RETRY_S = 1.0


class ConsumerLost(Exception):
    """The follower's consumer or its request is gone: make a new one."""


async def follow_pull(
    nc: NatsClient,
    js: JetStreamContext,
    stream: str,
    subjects: str,
    from_seq: int,
    on_message: Callable[[Msg], Awaitable[None]],
    name: str | None = None,
) -> Callable[[], Awaitable[None]]:
    """Deliver every message of `stream` on `subjects` from `from_seq` on, in order, to
    `on_message` (which may wait: the next one comes once it returns); returns `stop`.
    `name`: the consumer's fixed name (one the identity may use: an agent's view),
    made anew each time, an earlier one of that name deleted first; None: a new name
    each time."""
    follower = _Follower(nc, js, stream, subjects, from_seq, on_message, name)
    task = asyncio.create_task(follower.run(), name=f"follow {stream} from {from_seq}")

    async def stop() -> None:
        await cancel_and_wait(task)  # one cancel can be dropped: `gpuloom.tasks`

    return stop


def _into(queue: asyncio.Queue[Msg]) -> Callable[[Msg], Awaitable[None]]:
    """A subscription callback that only queues (the follower takes from the queue)."""

    async def arrived(msg: Msg) -> None:
        queue.put_nowait(msg)

    return arrived


class _Follower:
    def __init__(
        self,
        nc: NatsClient,
        js: JetStreamContext,
        stream: str,
        subjects: str,
        from_seq: int,
        on_message: Callable[[Msg], Awaitable[None]],
        fixed_name: str | None = None,
    ) -> None:
        self.nc, self.js, self.stream, self.subjects = nc, js, stream, subjects
        self.fixed_name = fixed_name
        #: The next sequence to deliver: where a new consumer starts.
        self.next_seq = max(1, from_seq)
        self.on_message = on_message
        self.names = NUID()

    async def run(self) -> None:
        while True:
            try:
                name = await self._make_consumer()
            except Exception as exc:  # the server is away, or restarting: try again
                log.warning("cannot follow %s from seq %d yet: %r", self.stream, self.next_seq, exc)
                await asyncio.sleep(RETRY_S)
                continue
            inbox = self.nc.new_inbox()
            received: asyncio.Queue[Msg] = asyncio.Queue()  # holds at most a batch
            sub = await self.nc.subscribe(inbox, cb=_into(received))
            try:
                await self._pull(name, inbox, received)
            except ConsumerLost as lost:
                log.info("following %s again from seq %d: %s", self.stream, self.next_seq, lost)
                await asyncio.sleep(RETRY_S / 10)  # a consumer refused at once must not spin
            except Exception as exc:  # a disconnection mid-request
                log.warning("following %s again from seq %d: %r", self.stream, self.next_seq, exc)
                await asyncio.sleep(RETRY_S)
            finally:
                with contextlib.suppress(Exception):
                    await sub.unsubscribe()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self.js.delete_consumer(self.stream, name), 2.0)

    async def _make_consumer(self) -> str:
        name = self.fixed_name or f"follow-{self.names.next().decode()}"
        if self.fixed_name is not None:  # one left by an earlier run, whatever its start
            with contextlib.suppress(NotFoundError):
                await asyncio.wait_for(self.js.delete_consumer(self.stream, name), 2.0)
        config = ConsumerConfig(
            name=name,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE,
            opt_start_seq=self.next_seq,
            ack_policy=AckPolicy.NONE,
            filter_subject=self.subjects,
            inactive_threshold=INACTIVE_S,
            mem_storage=True,
            num_replicas=1,
        )
        await self.js.add_consumer(self.stream, config=config)
        return name

    async def _ask(self, name: str, inbox: str) -> None:
        request = {
            "batch": BATCH,
            "expires": int(EXPIRES_S * 1e9),
            "idle_heartbeat": int(HEARTBEAT_S * 1e9),
        }
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.stream}.{name}"
        await self.nc.publish(subject, json.dumps(request).encode(), reply=inbox)

    async def _pull(self, name: str, inbox: str, received: asyncio.Queue[Msg]) -> None:
        reconnects = self.nc.stats["reconnects"]
        await self._ask(name, inbox)
        delivered = 0
        consumer_seq = 0
        while True:
            try:  # not nats-py's next_msg: a stop (cancel) could hang in it
                async with asyncio.timeout(DEAD_AFTER_S):
                    msg = await received.get()
            except TimeoutError:
                raise ConsumerLost(f"nothing heard for {DEAD_AFTER_S:.1f} s") from None
            if self.nc.stats["reconnects"] != reconnects:
                raise ConsumerLost("reconnected: what was sent meanwhile may be lost")
            status = msg.headers.get("Status") if msg.headers and not msg.data else None
            if status is not None:
                if status == "100":  # idle heartbeat: the request is alive
                    continue
                if status in ("404", "408"):  # nothing more for now, or expired: ask again
                    await self._ask(name, inbox)
                    delivered = 0
                    continue
                description = msg.headers.get("Description", "") if msg.headers else ""
                raise ConsumerLost(f"status {status} {description}".strip())
            delivered += 1
            if delivered == BATCH:  # the request is done: ask for the next batch now
                await self._ask(name, inbox)
                delivered = 0
            sequence = msg.metadata.sequence
            if int(sequence.consumer) != consumer_seq + 1:
                raise ConsumerLost(f"delivery {sequence.consumer} after {consumer_seq}")
            consumer_seq = int(sequence.consumer)
            seq = int(sequence.stream)
            if seq < self.next_seq:  # delivered already (a consumer made anew)
                continue
            await self.on_message(msg)
            self.next_seq = seq + 1

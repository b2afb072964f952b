"""The public event stream behind `GET /v1/events`: the log, as CloudEvents, filtered
and limited to what the principal may see, resumable by sequence.

Each stream reads the log from the sequence it asked for (`services.gateway.fanout`:
its own follower while it is behind, the hub shared by every stream at the log's
end), so a client resumes at any sequence the log still holds, in order, with no gap
and no repeat: the SSE `id:` of each event is its sequence, and a reconnect with
`Last-Event-ID` (or `?after=`) starts right after it. The stream opens with an `open`
event whose id is the position it starts after, so a client that loses the
connection before any event resumes from there too.

A client that does not read holds at most `SHARED_BUFFER` events of the hub's
shared batches here, then leaves the hub for its own follower, which stops pulling
once `BUFFER` wait (the server keeps the rest); if it stays stuck
for `SLOW_AFTER_S`,
its stream ends with an `error` event (`reason: slow`, and the sequence to resume
after) instead of holding a consumer for ever. A position the log no longer holds
(its start was archived and dropped) gets an `error` event (`reason: gone`) at once.

Who sees what (docs/security.md) is `gpuloom.auth.visibility`, the webhooks' rule
too: an operator every event; a user the events of the jobs they may read the events
of (their own, and those of accounts they coordinate), of the accounts they belong to
or coordinate, and of the cluster (nodes, pools, queue policy, priority classes,
limits); audits and webhooks are for operators.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import orjson
from fastapi.sse import format_sse_event

from gpuloom.auth import Principal
from gpuloom.auth.policy import Accounts
from gpuloom.auth.visibility import Owners, StreamFilter, needs_owner, visible
from gpuloom.bus import EventBus, Incoming
from gpuloom.events import Event, MalformedEvent, decode
from gpuloom.events.cloud import to_cloudevent
from gpuloom.events.subjects import job_subjects
from services.gateway.fanout import Batch, Feed, Hub
from services.gateway.stream_budget import Ticket

log = logging.getLogger(__name__)

#: Events waiting for one client: then its follower stops pulling.
BUFFER = 256
#: Events of the hub's (shared) batches waiting for one client: then it leaves the
#: hub for its own follower. They cost the stream a reference each, not a copy: a
#: client may pause about ten seconds of a 350-events-a-second burst and stay.
SHARED_BUFFER = 4096
#: A client that takes nothing this long is disconnected (it resumes where it was).
SLOW_AFTER_S = 30.0
#: A keep-alive comment after this long without an event (proxies close idle streams).
PING_S = 15.0
PING = b": ping\n\n"
#: The most events one write to a client holds.
CHUNK_EVENTS = 256
#: Under load, a stream writes at most once in this long (the events of the meantime
#: go together): 100 clients of a burst of 350 events a second make 1,000 writes a
#: second, not 35,000. A quiet stream's event goes at once. The hub batches for the
#: streams at the log's end (`Hub.linger_s`); this is for those behind it.
LINGER_S = 0.1
#: The principal and the filter of a stream: streams of one kind get the same events.
Kind = tuple[str, frozenset[str], StreamFilter]
#: Kinds of streams numbered before the table starts anew.
KINDS_KEPT = 10_000


@dataclass(frozen=True, slots=True)
class Made:
    """One event of the log as every stream sends it."""

    event: Event
    #: The event's own id (its CloudEvent `id`).
    event_id: str
    #: Its CloudEvent JSON (one line).
    cloud: str
    #: Its SSE event on the wire: the sequence as `id`, the CloudEvent as `data`.
    wire: bytes
    #: Whether it goes to streams of one principal and filter, decided by the first of
    #: them (by `Streams.kind_of`): streams that would decide the same decide once.
    verdicts: dict[int, bool] = field(default_factory=dict)


class Decoded:
    """Each event of the log decoded and encoded once for every stream: streams that
    follow the log's end ask for the same sequences at about the same time (the most
    recent `KEPT` are kept)."""

    KEPT = 4096

    def __init__(self) -> None:
        self._by_seq: OrderedDict[int, Made | None] = OrderedDict()

    def of(self, message: Incoming) -> Made | None:
        """The event made for streams; None: malformed (every service skipped it)."""
        if message.seq in self._by_seq:
            return self._by_seq[message.seq]
        try:
            recorded = decode(message.seq, message.body, message.stored_at, subject=message.subject)
        except MalformedEvent:
            made = None
        else:
            cloud = orjson.dumps(to_cloudevent(recorded)).decode()
            wire = format_sse_event(data_str=cloud, id=str(message.seq))
            made = Made(recorded.event, recorded.envelope.id, cloud, wire)
        self._by_seq[message.seq] = made
        while len(self._by_seq) > self.KEPT:
            self._by_seq.popitem(last=False)
        return made


def control_event(event: str, data: dict[str, object], id: str | None = None) -> bytes:
    """An `open` or `error` event on the wire."""
    return format_sse_event(data_str=orjson.dumps(data).decode(), event=event, id=id)


def error_event(reason: str, detail: str, resume_after: int) -> bytes:
    return control_event(
        "error", {"reason": reason, "detail": detail, "resume_after": resume_after}
    )


@dataclass
class Streams:
    """What every stream of one gateway shares: the decoded events, the hub, and the
    kinds of streams (principal and filter) as small numbers."""

    decoded: Decoded = field(default_factory=Decoded)
    hub: Hub = field(default_factory=lambda: Hub(linger_s=LINGER_S, batch_most=CHUNK_EVENTS))
    kinds: dict[Kind, int] = field(default_factory=dict)
    _numbered: int = 0
    #: Who owns the jobs the streams passed (one table for all: it holds facts).
    owners: Owners | None = None

    def kind_of(self, kind: Kind) -> int:
        """The number of `kind`. Kinds are few (one per principal and filter in use);
        past `KINDS_KEPT` the table starts anew, with numbers never given before, so
        that no verdict of an old number is taken for a new kind."""
        number = self.kinds.get(kind)
        if number is None:
            if len(self.kinds) >= KINDS_KEPT:
                self.kinds.clear()
            self._numbered += 1
            number = self.kinds[kind] = self._numbered
        return number


async def event_stream(
    bus: EventBus,
    after: int,
    wanted: StreamFilter,
    principal: Principal,
    owners: Owners,
    accounts: Callable[[], Accounts],
    shared: Streams | None = None,
    ticket: Ticket | None = None,
) -> AsyncIterator[bytes]:
    """The events after sequence `after` that `principal` may see and asked for, then
    the new ones as they are written, as SSE events with the sequence as their id:
    each chunk holds every event that was waiting (one write, not one per event), and
    a keep-alive comment comes after `PING_S` without one.

    A stream of one job follows that job's subject only: the server reads its events
    from its subject index, not the whole log (`?after=0&job=J` is cheap on a long log).
    The others take the log's messages from the shared hub once they reached it
    (`services.gateway.fanout`)."""
    figures = await bus.stream_figures()
    if after < figures.first_seq - 1:
        yield error_event(
            "gone",
            f"the log no longer holds the events after seq {after}: it starts at seq "
            f"{figures.first_seq} (older events are in its archive)",
            figures.first_seq - 1,
        )
        if ticket is not None:
            ticket.close()
        return
    shared = shared or Streams()
    if wanted.job is not None:
        feed = Feed(bus, None, after, buffer=BUFFER, slow_after_s=SLOW_AFTER_S,
                    subjects=job_subjects(wanted.job))  # fmt: skip
    else:
        feed = Feed(bus, shared.hub, after, buffer=BUFFER, shared_buffer=SHARED_BUFFER,
                    slow_after_s=SLOW_AFTER_S)  # fmt: skip
    owner_needed = needs_owner(principal, wanted)
    kind = shared.kind_of((principal.name, frozenset(principal.roles), wanted))
    loop = asyncio.get_running_loop()
    last_write = 0.0
    sent = after

    async def chunk_of(batch: Batch) -> bytes:
        """What this stream sends of `batch`: its events this principal may see and asked
        for (decided once per event and kind of stream, made once per hub batch)."""
        piece = batch.chunks.get(kind)
        if piece is not None:
            return piece
        wires = []
        for message in batch.messages:
            made = shared.decoded.of(message)
            if made is None:
                continue
            verdict = made.verdicts.get(kind)
            if verdict is None:
                owners.learn(made.event)
                job_owner = await owners.of(made.event) if owner_needed else None
                allowed = visible(principal, made.event, job_owner, accounts())
                verdict = allowed and wanted.wants(made.event, job_owner)
                made.verdicts[kind] = verdict
            if verdict:
                wires.append(made.wire)
        piece = b"".join(wires)
        if batch.shared:
            batch.chunks[kind] = piece
        return piece

    try:
        await feed.start()
        # where it starts: a client that loses the connection before any event resumes
        # here (a browser's EventSource keeps the id for its Last-Event-ID)
        yield control_event("open", {"after": after}, id=str(after))
        while True:
            if feed.slow.is_set() and feed.empty():
                yield error_event(
                    "slow",
                    f"this client took no event for {SLOW_AFTER_S:.0f} s; resume with "
                    f"Last-Event-ID: {sent}",
                    sent,
                )
                return
            if feed.empty():
                try:
                    async with asyncio.timeout(PING_S):
                        await feed.wait()
                except TimeoutError:
                    yield PING
                    continue
            if not feed.on_hub:
                # its own follower's messages come one by one: under load, at most one
                # write per LINGER_S (the hub batches its own)
                linger = last_write + LINGER_S - loop.time()
                if linger > 0:
                    await asyncio.sleep(linger)
            if ticket is not None and ticket.replaying and feed.on_hub:
                ticket.caught_up()  # no longer a replay: it reads the shared hub
            pieces = []
            for batch in feed.take(CHUNK_EVENTS):
                sent = batch.last_seq
                piece = await chunk_of(batch)
                if piece:
                    pieces.append(piece)
            if pieces:
                last_write = loop.time()
                yield b"".join(pieces) if len(pieces) > 1 else pieces[0]
    finally:
        if ticket is not None:
            ticket.close()
        with contextlib.suppress(Exception):
            await feed.close()

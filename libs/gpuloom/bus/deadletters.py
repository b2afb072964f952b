"""Dead letters: messages a service could not handle, kept where an operator can look.

A malformed log entry, an event a fold rule failed on, or a bad heartbeat must cost
that one message, never the service; but skipping it silently hides a bug or an
attack. So the service records it on the dead-letter stream (`<stream>_DLQ`,
subjects `gpuloom.dlq.<service>.<source>`), counts it, and goes on.

Folding is synchronous and hot, so `DeadLetters.put` only queues (bounded); one
background task publishes. A dead letter that cannot be published is logged and
dropped: the log itself still holds the message. Each log entry is dead-lettered
once per service: `Nats-Msg-Id` is `<service>:<seq>`, and a service that restarts
after the de-duplication window skips what its last dead letter already covers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
from nats.js import JetStreamContext
from nats.js.errors import NotFoundError

from gpuloom.bus.messages import Incoming, ReasonKind
from gpuloom.bus.streams import DEAD_LETTER_PREFIX, dead_letter_stream
from gpuloom.events import intents
from gpuloom.telemetry.metrics import DEAD_LETTERS

log = logging.getLogger(__name__)

#: At most this much of the message's body is kept (it is evidence, not a copy).
EXCERPT_BYTES = 2048
REASON_CHARS = 1000
#: Dead letters waiting to be published; more are dropped (and counted in the log).
MAX_QUEUED = 1000

Source = Literal["log", "heartbeat"]
#: `malformed`: not a valid envelope; `fault`: a fold rule failed on it;
#: `heartbeat`: a heartbeat inventory refused.


def dead_letter_subject(service: str, source: Source) -> str:
    return f"{DEAD_LETTER_PREFIX}.{service}.{source}"


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One message a service could not handle, and why."""

    service: str
    source: Source
    subject: str
    reason_kind: ReasonKind
    reason: str
    body: bytes
    at: datetime
    #: The log's sequence of the message (None for a heartbeat).
    seq: int | None = None
    envelope_id: str | None = None

    def msg_id(self) -> str | None:
        return intents.dead_letter(self.service, self.seq) if self.seq is not None else None

    def encode(self) -> bytes:
        excerpt, encoding = excerpt_of(self.body)
        return orjson.dumps(
            {
                "service": self.service,
                "source": self.source,
                "seq": self.seq,
                "subject": self.subject,
                "reason_kind": self.reason_kind,
                "reason": self.reason[:REASON_CHARS],
                "envelope_id": self.envelope_id,
                "size": len(self.body),
                "excerpt": excerpt,
                "excerpt_encoding": encoding,
                "at": self.at.isoformat(),
            }
        )


def redacted(body: bytes) -> bytes:
    """The body with a job's environment values replaced by `<redacted>`, when it is
    an envelope: they hold secrets, and a dead letter is read by operators."""
    try:
        doc = orjson.loads(body)
        env = doc["data"]["spec"]["env"]
    except (orjson.JSONDecodeError, KeyError, TypeError):
        return body
    if not isinstance(env, dict) or not env:
        return body
    doc["data"]["spec"]["env"] = {name: "<redacted>" for name in env}
    return orjson.dumps(doc)


def excerpt_of(body: bytes, limit: int = EXCERPT_BYTES) -> tuple[str, str]:
    """The first `limit` bytes as text when they are UTF-8 (JSON escapes the rest),
    else as base64; with the encoding used ("utf-8" or "base64"). Environment values
    of a job are redacted first."""
    body = redacted(body)
    cut = body[:limit]
    for trim in range(4 if len(body) > limit else 1):  # a cut may split one character
        with contextlib.suppress(UnicodeDecodeError):
            return cut[: len(cut) - trim].decode("utf-8"), "utf-8"
    return base64.b64encode(cut).decode("ascii"), "base64"


def envelope_id_of(body: bytes) -> str | None:
    """The envelope id of a body that is JSON with a short string `id`, else None."""
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    found = doc.get("id") if isinstance(doc, dict) else None
    return found if isinstance(found, str) and len(found) <= 64 else None


class DeadLetters:
    """The dead-letter outbox of one service on one bus (get it with `bus.dead_letters`):
    it writes to the dead-letter stream of the log stream `stream`."""

    def __init__(
        self, js: JetStreamContext, stream: str, service: str, publish_timeout_s: float = 2.0
    ) -> None:
        self.js = js
        self.stream = stream
        self.service = service
        self.publish_timeout_s = publish_timeout_s
        self.published = 0
        self.dropped = 0
        self._queue: deque[DeadLetter] = deque()
        self._task: asyncio.Task[None] | None = None
        #: The highest log seq this service dead-lettered before (read once, lazily).
        self._covered_seq: int | None = None

    def from_log(
        self,
        message: Incoming,
        reason_kind: ReasonKind,
        reason: str,
        envelope_id: str | None = None,
    ) -> None:
        """Dead-letter a log entry this service could not handle."""
        self.put(
            DeadLetter(
                service=self.service,
                source="log",
                subject=message.subject,
                reason_kind=reason_kind,
                reason=reason,
                body=message.body,
                at=datetime.now(UTC),
                seq=message.seq,
                envelope_id=envelope_id or envelope_id_of(message.body),
            )
        )

    def put(self, letter: DeadLetter) -> None:
        """Queue `letter` for publishing; never blocks, never raises."""
        if len(self._queue) >= MAX_QUEUED:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 1000 == 0:
                log.error("%d dead letters dropped: the outbox is full", self.dropped)
            return
        self._queue.append(letter)
        if self._task is None or self._task.done():
            with contextlib.suppress(RuntimeError):  # no running loop: sent by the next put
                self._task = asyncio.get_running_loop().create_task(self._send())

    async def flush(self, timeout: float) -> None:
        """Wait until the queued dead letters are published or dropped; after `timeout`
        stop trying (on close: a letter NATS will not take must not hold the process)."""
        if self._task is not None and not self._task.done():
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._task, timeout)

    async def _send(self) -> None:
        if self._covered_seq is None:
            self._covered_seq = await self._last_covered_seq()
        while self._queue:
            letter = self._queue.popleft()
            if letter.seq is not None and letter.seq <= self._covered_seq:
                continue  # dead-lettered before this process started
            try:
                duplicate = await self._publish(letter)
            except Exception as exc:  # NATS away, or no DLQ stream: the log still has it
                self.dropped += 1
                duplicate = False
                log.warning("dead letter of %s not published: %s", _where(letter), exc)
            else:
                self.published += not duplicate
                if letter.seq is not None:
                    self._covered_seq = max(self._covered_seq, letter.seq)
            if not duplicate:  # counted once per message, published or not
                DEAD_LETTERS.labels(letter.service, letter.reason_kind).inc()

    async def _publish(self, letter: DeadLetter) -> bool:
        """Publish one dead letter; True when the stream already had it (Nats-Msg-Id)."""
        msg_id = letter.msg_id()
        ack = await self.js.publish(
            dead_letter_subject(letter.service, letter.source),
            letter.encode(),
            timeout=self.publish_timeout_s,
            stream=dead_letter_stream(self.stream),
            headers={"Nats-Msg-Id": msg_id} if msg_id else None,
        )
        return bool(ack.duplicate)

    async def _last_covered_seq(self) -> int:
        try:
            last = await self.js.get_last_msg(
                dead_letter_stream(self.stream), dead_letter_subject(self.service, "log")
            )
            seq = orjson.loads(last.data or b"{}").get("seq")
        except NotFoundError:
            return 0
        except Exception as exc:  # unreadable: rely on Nats-Msg-Id de-duplication alone
            log.warning("cannot read the last dead letter of %s: %s", self.service, exc)
            return 0
        return seq if isinstance(seq, int) else 0


def _where(letter: DeadLetter) -> str:
    return f"seq {letter.seq}" if letter.seq is not None else letter.subject


async def read_dead_letters(
    js: JetStreamContext, stream: str, limit: int
) -> tuple[int, list[dict[str, Any]]]:
    """(how many the stream holds, the newest `limit` of them, newest first).

    Each is the stored JSON plus `dlq_seq`; an entry that is not JSON (someone
    else wrote on `gpuloom.dlq.>`) comes back as its excerpt. No stream: (0, []).
    """
    name = dead_letter_stream(stream)
    try:
        info = await js.stream_info(name)
    except NotFoundError:
        return 0, []
    letters: list[dict[str, Any]] = []
    seq, first = int(info.state.last_seq), int(info.state.first_seq)
    while seq >= max(first, 1) and len(letters) < limit:
        try:
            stored = await js.get_msg(name, seq=seq)
        except NotFoundError:  # deleted, or aged out while reading
            seq -= 1
            continue
        letters.append({**_parsed(stored.data or b""), "dlq_seq": seq})
        seq -= 1
    return int(info.state.messages), letters


def _parsed(data: bytes) -> dict[str, Any]:
    with contextlib.suppress(orjson.JSONDecodeError):
        doc = orjson.loads(data)
        if isinstance(doc, dict):
            return doc
    excerpt, encoding = excerpt_of(data)
    return {"reason": "not a gpuloom dead letter", "excerpt": excerpt, "excerpt_encoding": encoding}

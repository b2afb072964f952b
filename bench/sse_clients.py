"""Clients of the event stream (`GET /v1/events`) for `bench/e2e_throughput.py
--sse-clients N`: N streams read at once, in a thread of their own, each event's
delivery latency taken as its receipt time minus its CloudEvents `time` (when its
writer made it; one machine, one clock).

The clients share the machine with the stack, so they read as cheaply as they can:
the first `PARSED` parse every event (the latency figures), the others count the
events in the bytes they receive. Parsing 35,000 events a second in Python in the
bench's own process would otherwise take the CPU the pipeline is measured on."""

from __future__ import annotations

import asyncio
import multiprocessing
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit

import orjson

#: Clients that parse every event (the others count them).
PARSED = 10


@dataclass
class StreamFigures:
    """`count` streams from the log's end, with `token`, and what they measured."""

    url: str
    token: str
    count: int
    latencies: list[float] = field(default_factory=list)
    received: list[int] = field(default_factory=list)
    ended: list[str] = field(default_factory=list)


@dataclass
class Readers(StreamFigures):
    """The streams, in a thread of this process; `start`, then `stop`.

    Each reads its stream over a plain socket (HTTP/1.1, chunked), not an HTTP client
    library: httpx took a tenth of a core for 100 streams, CPU the pipeline that is
    measured beside them then lacked (real clients run on other machines)."""

    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _opened: int = 0

    def start(self, timeout: float = 60) -> None:
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while self._opened < self.count:  # every stream's start is fixed: none misses one
            if time.monotonic() > deadline:
                raise RuntimeError(f"only {self._opened} of {self.count} streams opened")
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)

    async def _run(self) -> None:
        readers = [asyncio.create_task(self._read(parsed=i < PARSED)) for i in range(self.count)]
        while not self._stop.is_set():
            await asyncio.sleep(0.2)
        for reader in readers:
            reader.cancel()
        await asyncio.gather(*readers, return_exceptions=True)

    async def _open(self) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """A connection whose response to `GET /v1/events` began (its head read)."""
        url = urlsplit(self.url)
        host, port = url.hostname or "127.0.0.1", url.port or 80
        reader, writer = await asyncio.open_connection(host, port, limit=1 << 20)
        writer.write(
            f"GET /v1/events HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Authorization: Bearer {self.token}\r\nAccept: text/event-stream\r\n\r\n".encode()
        )
        head = await reader.readuntil(b"\r\n\r\n")
        status = head.split(b" ", 2)[1]
        if status != b"200" or b"transfer-encoding: chunked" not in head.lower():
            raise RuntimeError(f"the stream answered {head.decode(errors='replace')}")
        self._opened += 1
        return reader, writer

    async def _read(self, parsed: bool) -> None:
        count = 0
        reader, writer = await self._open()
        try:
            if not parsed:
                await self._count(reader)
                return
            body, text = Dechunked(), b""
            while data := await reader.read(1 << 16):
                blocks = (text + body.feed(data)).split(b"\n\n")
                text = blocks.pop()
                for block in blocks:
                    if block.startswith(b"data: "):  # an event of the log
                        at = orjson.loads(block[6 : block.index(b"\n")])["time"]
                        self.latencies.append(time.time() - _epoch(at))
                        count += 1
                    elif block.startswith(b"event: error"):
                        self.ended.append(block.decode(errors="replace"))
        finally:
            writer.close()
            if parsed:
                self.received.append(count)

    async def _count(self, reader: asyncio.StreamReader) -> None:
        """Count the events of the stream without parsing them: each has one `id:`
        line after its `data:` line (the `open` event too); an `error` event ends it."""
        count, tail = 0, b""
        try:
            while chunk := await reader.read(1 << 16):
                data = tail + chunk
                count += data.count(b"\nid: ")
                if b"event: error" in data:
                    self.ended.append("error")
                tail = data[-4:]
        finally:
            self.received.append(max(0, count - 1))  # not the `open` event


class Dechunked:
    """HTTP/1.1 chunked transfer coding undone, as the bytes arrive."""

    def __init__(self) -> None:
        self.buffer = b""
        self.left = 0  # bytes of the current chunk still to come
        self.skip = 0  # bytes of the CRLF after it still to come
        self.ended = False  # the last chunk came

    def feed(self, data: bytes) -> bytes:
        self.buffer += data
        out = bytearray()
        while not self.ended:
            if self.left:
                piece = self.buffer[: self.left]
                out += piece
                self.buffer = self.buffer[len(piece) :]
                self.left -= len(piece)
                if self.left:
                    break
                self.skip = 2
            if self.skip:
                gone = min(self.skip, len(self.buffer))
                self.buffer = self.buffer[gone:]
                self.skip -= gone
                if self.skip:
                    break
            end = self.buffer.find(b"\r\n")
            if end < 0:
                break
            self.left = int(self.buffer[:end].split(b";")[0], 16)
            self.buffer = self.buffer[end + 2 :]
            self.ended = not self.left
        return bytes(out)


def _epoch(iso: str) -> float:
    return datetime.fromisoformat(iso).timestamp()


@dataclass
class ReaderProcess(StreamFigures):
    """`Readers` in a process of their own: in the bench's process they would share its
    GIL with the submitting client, and slow the submissions the pipeline's throughput
    is measured by (as a browser's streams do not slow another program's requests)."""

    _process: Any = None
    _events: Any = None

    def start(self, timeout: float = 60) -> None:
        context = multiprocessing.get_context("spawn")
        opened, stop, results = context.Event(), context.Event(), context.Queue()
        self._events = (stop, results)
        self._process = context.Process(
            target=_read_in_child,
            args=(self.url, self.token, self.count, opened, stop, results),
            daemon=True,
        )
        self._process.start()
        if not opened.wait(timeout):
            raise RuntimeError(f"the {self.count} streams did not open in {timeout:.0f} s")

    @property
    def pid(self) -> int:
        return int(self._process.pid)

    def stop(self) -> None:
        stop, results = self._events
        stop.set()
        self.latencies, self.received, self.ended = results.get(timeout=120)
        self._process.join(30)


def _read_in_child(url: str, token: str, count: int, opened: Any, stop: Any, results: Any) -> None:
    readers = Readers(url, token, count)
    readers.start()
    opened.set()
    stop.wait()
    readers.stop()
    results.put((readers.latencies, readers.received, readers.ended))

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
import json
import multiprocessing
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx

from gpuloom.client.sse import parse_sse

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
    """The streams, in a thread of this process; `start`, then `stop`."""

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
        limits = httpx.Limits(max_connections=self.count + 10)
        headers = {"Authorization": f"Bearer {self.token}"}
        timeout = httpx.Timeout(30, read=60)
        async with httpx.AsyncClient(
            base_url=self.url, headers=headers, timeout=timeout, limits=limits
        ) as client:
            readers = [
                asyncio.create_task(self._read(client, parsed=i < PARSED))
                for i in range(self.count)
            ]
            while not self._stop.is_set():
                await asyncio.sleep(0.2)
            for reader in readers:
                reader.cancel()
            await asyncio.gather(*readers, return_exceptions=True)

    async def _read(self, client: httpx.AsyncClient, parsed: bool) -> None:
        if not parsed:
            await self._count(client)
            return
        count = 0
        try:
            async with client.stream("GET", "/v1/events") as response:
                response.raise_for_status()
                self._opened += 1
                lines: list[str] = []
                async for line in response.aiter_lines():
                    if line:
                        lines.append(line)
                        continue
                    for event in parse_sse([*lines, ""]):
                        if event.event == "message":
                            at = json.loads(event.data)["time"]
                            made = _epoch(at)
                            self.latencies.append(time.time() - made)
                            count += 1
                        elif event.event == "error":
                            self.ended.append(event.data)
                    lines = []
        finally:
            self.received.append(count)

    async def _count(self, client: httpx.AsyncClient) -> None:
        """Count the events of the stream without parsing them: each starts with an
        `id:` line (the `open` event too); an `error` event ends it."""
        count, tail = 0, b""
        try:
            async with client.stream("GET", "/v1/events") as response:
                response.raise_for_status()
                self._opened += 1
                async for chunk in response.aiter_raw():
                    data = tail + chunk
                    count += data.count(b"\nid: ") + data.startswith(b"id: ")
                    if b"event: error" in data:
                        self.ended.append("error")
                    tail = data[-4:]
        finally:
            self.received.append(max(0, count - 1))  # not the `open` event


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

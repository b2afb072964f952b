"""A webhook receiver for `bench/e2e_throughput.py --webhooks N`: an aiohttp server in
a thread of its own that answers 204 at once, and takes each delivery's latency as its
receipt time minus its CloudEvents `time` (when its writer made it; one machine, one
clock)."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from dataclasses import dataclass, field
from datetime import datetime

try:
    from aiohttp import web
except ImportError as missing:  # the `bench` extra, not `dev`: see pyproject.toml
    raise SystemExit("the benchmarks need aiohttp: pip install -e '.[bench]'") from missing


@dataclass
class Receiver:
    latencies: list[float] = field(default_factory=list)
    received_at: list[float] = field(default_factory=list)
    ids: set[tuple[str, str]] = field(default_factory=set)
    repeats: int = 0
    port: int = 0
    _ready: threading.Event = field(default_factory=threading.Event)
    _stop: threading.Event = field(default_factory=threading.Event)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True).start()
        self._ready.wait(10)

    def stop(self) -> None:
        self._stop.set()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_post("/{hook}", self._take)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        self._ready.set()
        while not self._stop.is_set():
            await asyncio.sleep(0.2)
        await runner.cleanup()

    async def _take(self, request: web.Request) -> web.Response:
        body = await request.read()
        now = time.time()
        event = json.loads(body)
        key = (request.match_info["hook"], request.headers["webhook-id"])
        if key in self.ids:
            self.repeats += 1
        else:
            self.ids.add(key)
            self.received_at.append(now)
            self.latencies.append(now - datetime.fromisoformat(event["time"]).timestamp())
        return web.Response(status=204)

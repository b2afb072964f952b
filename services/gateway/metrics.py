"""GET /metrics: the process's Prometheus metrics plus gauges of the cluster, computed
at scrape time from the state the gateway has folded (`reads.gauges`).

The route answers at exactly /metrics (a mounted ASGI app answers 307 to /metrics/,
which some scrapers do not follow). It is async on purpose: the collector then reads
the folded state on the event loop, where the fold changes it, never in a thread
while a fold is half done. Before collecting it asks the stream for its last sequence,
so that `gpuloom_projection_lag` is that of the scrape, not of the last batch.

The cluster collector lives in a registry of its own app, not the process-wide one:
tests build several apps in one process, and each must report its own gateway.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from gpuloom.bus.errors import BusError
from gpuloom.bus.messages import StreamFigures
from services.gateway.eventlog import EventLog
from services.gateway.parts import Gateway
from services.gateway.reads import Reads

log = logging.getLogger(__name__)

#: How long a scrape waits for the stream's last sequence before it uses the last known.
STREAM_SEQ_TIMEOUT_S = 1.0


class ClusterCollector(Collector):
    """The cluster's gauges of the gateway's fold (`reads.gauges`); nothing until it
    has read the log."""

    def __init__(self, reads: Reads, clock: Callable[[], datetime]) -> None:
        self.reads = reads
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        yield from self.reads.gauges.cluster(self.clock)


class StreamCollector(Collector):
    """The event log's size (`gpuloom_stream_*`), as of the scrape: the full log is kept
    by default (the audit trail), so its growth is what an operator watches
    (`rate(gpuloom_stream_bytes[1d])`) to size the disk or to cap the stream."""

    def __init__(self) -> None:
        self.figures: StreamFigures | None = None

    def collect(self) -> Iterator[Metric]:
        figures = self.figures
        if figures is None:
            return
        yield GaugeMetricFamily(
            "gpuloom_stream_messages", "Events held in the stream", value=figures.messages
        )
        yield GaugeMetricFamily(
            "gpuloom_stream_bytes", "Bytes the stream holds on the server", value=figures.bytes
        )
        yield GaugeMetricFamily(
            "gpuloom_stream_first_seq",
            "The stream's first sequence still held (above 1 once older events were dropped)",
            value=figures.first_seq,
        )
        yield GaugeMetricFamily(
            "gpuloom_stream_last_seq", "The stream's last sequence", value=figures.last_seq
        )
        # Always there, -1 without a limit (NATS's own word for none): a rule that
        # divides by it never fires then, and never waits on a series that is not there.
        yield GaugeMetricFamily(
            "gpuloom_stream_max_bytes",
            "The stream's byte limit (past it the server drops the oldest events); -1: none",
            value=figures.max_bytes if figures.max_bytes and figures.max_bytes > 0 else -1,
        )
        yield GaugeMetricFamily(
            "gpuloom_stream_max_messages",
            "The stream's event limit (past it the server drops the oldest events); -1: none",
            value=figures.max_messages if figures.max_messages and figures.max_messages > 0 else -1,
        )
        replicas = GaugeMetricFamily(
            "gpuloom_stream_replicas",
            "Copies of the event log: those configured (wanted) and those current now",
            labels=["state"],
        )
        replicas.add_metric(["wanted"], figures.replicas_wanted)
        replicas.add_metric(["current"], figures.replicas_current)
        yield replicas


async def refresh_stream_seq(
    reads: Reads, event_log: EventLog, stream: StreamCollector | None = None
) -> None:
    """Ask the stream for its last sequence (the lag's reference) and, with `stream`,
    its size; on failure the figures stay the ones known, and the scrape still answers."""
    try:
        lag = await asyncio.wait_for(reads.progress.lag_behind_stream(), STREAM_SEQ_TIMEOUT_S)
        bus = event_log.bus()
        if lag is None or bus is None:  # no read model yet, or no connection
            return
        if stream is not None:
            stream.figures = await asyncio.wait_for(bus.stream_figures(), STREAM_SEQ_TIMEOUT_S)
    except (TimeoutError, BusError) as exc:
        log.warning("metrics: could not read the stream's last sequence: %r", exc)


def exposition(registries: Iterable[CollectorRegistry]) -> bytes:
    return b"".join(generate_latest(registry) for registry in registries)


Scrape = Callable[[], Awaitable[bytes]]


def add_metrics(
    app: FastAPI,
    gateway: Gateway,
    clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    dependencies: Sequence[Any] = (),
) -> Scrape:
    """Serve GET /metrics on `app`: the process-wide registry, then `gateway`'s cluster;
    return the scrape itself (for `serve_scrapes` on a port of its own).

    `dependencies`: what guards it (authentication, unless metrics are public)."""
    reads, event_log = Reads(gateway), EventLog(gateway)
    cluster = CollectorRegistry()
    cluster.register(ClusterCollector(reads, clock))
    stream = StreamCollector()
    cluster.register(stream)

    async def scrape() -> bytes:
        await refresh_stream_seq(reads, event_log, stream)
        return exposition([REGISTRY, cluster])

    @app.get("/metrics", include_in_schema=False, dependencies=list(dependencies))
    async def metrics() -> Response:
        # The classic text format, which every Prometheus reads (no content negotiation).
        return Response(await scrape(), media_type=CONTENT_TYPE_PLAIN_0_0_4)

    return scrape


#: Scrapes answered at once on the metrics port, and how long a request may take to come.
SCRAPES_AT_ONCE = 8
SCRAPE_REQUEST_TIMEOUT_S = 5.0


async def serve_scrapes(scrape: Scrape, host: str, port: int) -> asyncio.Server:
    """Answer `GET /metrics` on `host`:`port` without a token, for a Prometheus that
    scrapes the pod (GPULOOM_METRICS_PORT; loopback unless GPULOOM_METRICS_HOST says
    otherwise): the API's own port asks a token for /metrics.

    A minimal HTTP/1.1 server on the gateway's event loop (the collectors read the folded
    state there, never from a thread): one request per connection, all of it within 16 KiB
    of head and `SCRAPE_REQUEST_TIMEOUT_S`, at most `SCRAPES_AT_ONCE` scrapes at once (a
    client still sending its request holds none), anything but GET /metrics 404."""
    turns = asyncio.Semaphore(SCRAPES_AT_ONCE)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            async with asyncio.timeout(SCRAPE_REQUEST_TIMEOUT_S):
                head = await reader.readuntil(b"\r\n\r\n")
                words = head.split(b"\r\n", 1)[0].split()
                wanted = len(words) == 3 and words[0] == b"GET"
                if wanted and words[1].split(b"?", 1)[0] == b"/metrics":
                    async with turns:  # a slow client holds no turn: only scrapes do
                        status, kind, body = b"200 OK", CONTENT_TYPE_PLAIN_0_0_4, await scrape()
                else:
                    status, kind, body = b"404 Not Found", "text/plain", b"only GET /metrics\n"
                writer.write(
                    b"HTTP/1.1 %s\r\ncontent-type: %s\r\ncontent-length: %d\r\n"
                    b"connection: close\r\n\r\n%s" % (status, kind.encode(), len(body), body)
                )
                await writer.drain()
        except (
            TimeoutError,
            ConnectionError,
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,
        ):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(answer, host, port, limit=16 * 1024)

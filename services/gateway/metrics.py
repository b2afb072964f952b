"""GET /metrics: the process's Prometheus metrics plus gauges of the cluster, computed
at scrape time from the state the gateway has folded.

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
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, get_args

from fastapi import FastAPI
from fastapi.responses import Response
from prometheus_client import REGISTRY, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4
from prometheus_client.registry import Collector

from gpuloom.bus.errors import BusError
from gpuloom.bus.messages import StreamFigures
from gpuloom.events.units import MILLI_PER_GPU
from gpuloom.state import ClusterState
from gpuloom.state.model import JobPhase
from services.gateway.deps import Gateway

log = logging.getLogger(__name__)

#: The window of `gpuloom_placements_last_minute`.
RECENT = timedelta(seconds=60)
#: How long a scrape waits for the stream's last sequence before it uses the last known.
STREAM_SEQ_TIMEOUT_S = 1.0


def cluster_metrics(state: ClusterState, now: datetime) -> list[Metric]:
    """The cluster's gauges in `state`; `now` bounds the last minute of placements.

    Capacity and allocation count the GPUs of nodes that are not lost (cordoned ones
    included), by pool and model: a GPU is allocated when anything holds it, and its
    milli-GPU allocated are what its holders hold (1000 for a whole GPU)."""
    jobs = GaugeMetricFamily("gpuloom_jobs", "Jobs by state", labels=["state"])
    by_phase: Counter[str] = Counter(job.phase for job in state.jobs.values())
    by_phase.update(state.forgotten_by_phase)  # ended jobs the state no longer holds
    for phase in get_args(JobPhase):
        jobs.add_metric([phase], by_phase[phase])
    queue = GaugeMetricFamily(
        "gpuloom_queue_length", "Jobs queued, waiting for placement", value=len(state.queued)
    )

    nodes = GaugeMetricFamily("gpuloom_nodes", "Nodes by state", labels=["state"])
    node_states = Counter(
        "lost" if n.phase == "lost" else "cordoned" if n.cordoned else "ready"
        for n in state.nodes.values()
    )
    for node_state in ("ready", "cordoned", "lost"):
        nodes.add_metric([node_state], node_states[node_state])

    pools = ["pool", "model"]
    gpus = GaugeMetricFamily("gpuloom_gpus", "GPUs of nodes not lost", labels=pools)
    gpus_held = GaugeMetricFamily(
        "gpuloom_gpus_allocated", "GPUs something holds (whole or a slice)", labels=pools
    )
    milli = GaugeMetricFamily(
        "gpuloom_gpu_milli", "Milli-GPU of nodes not lost (1000 per GPU)", labels=pools
    )
    milli_held = GaugeMetricFamily(
        "gpuloom_gpu_milli_allocated", "Milli-GPU held by jobs", labels=pools
    )
    count: Counter[tuple[str, str]] = Counter()
    held: Counter[tuple[str, str]] = Counter()
    milli_used: Counter[tuple[str, str]] = Counter()
    for node in state.nodes.values():
        if node.phase == "lost":
            continue
        for gpu in node.gpus.values():
            key = (gpu.pool, gpu.model)
            count[key] += 1
            held[key] += not gpu.idle
            milli_used[key] += gpu.milli_used
    for key in sorted(count):
        gpus.add_metric(list(key), count[key])
        gpus_held.add_metric(list(key), held[key])
        milli.add_metric(list(key), MILLI_PER_GPU * count[key])
        milli_held.add_metric(list(key), milli_used[key])

    placements = CounterMetricFamily(
        "gpuloom_placements",
        "Placement decisions folded (JobPlaced): rate() is decisions per second",
        value=state.forgotten_attempts + sum(job.attempt for job in state.jobs.values()),
    )
    recent = GaugeMetricFamily(
        "gpuloom_placements_last_minute",
        "Jobs whose last placement was made in the last 60 s, ended ones included",
        value=placed_since(state, now - RECENT),
    )
    return [jobs, queue, nodes, gpus, gpus_held, milli, milli_held, placements, recent]


def placed_since(state: ClusterState, since: datetime) -> int:
    """Jobs whose last placement was made at `since` or later: the live ones, and those
    that ended and left the state since then (the newest end of `retired`: a job ends
    after it is placed, so no older entry can have been placed since)."""
    live = sum(1 for job in state.jobs.values() if job.placed_at and job.placed_at >= since)
    gone: set[str] = set()
    for left, job_id in reversed(state.retired):
        if left < since:
            break
        tombstone = state.tombstones.get(job_id)
        if tombstone is not None and tombstone.placed_at and tombstone.placed_at >= since:
            gone.add(job_id)
    return live + len(gone)


class ClusterCollector(Collector):
    """`cluster_metrics` of the gateway's projection; nothing until it has one."""

    def __init__(self, gateway: Gateway, clock: Callable[[], datetime]) -> None:
        self.gateway = gateway
        self.clock = clock

    def collect(self) -> Iterator[Metric]:
        read_model = self.gateway.read_model
        if read_model is not None:
            yield from cluster_metrics(read_model.state, self.clock())


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


async def refresh_stream_seq(gateway: Gateway, stream: StreamCollector | None = None) -> None:
    """Ask the stream for its last sequence (the lag's reference) and, with `stream`,
    its size; on failure the figures stay the ones known, and the scrape still answers."""
    read_model = gateway.read_model
    if read_model is None or gateway.bus is None or not gateway.bus.connected:
        return
    try:
        await asyncio.wait_for(read_model.lag_behind_stream(), STREAM_SEQ_TIMEOUT_S)
        if stream is not None:
            stream.figures = await asyncio.wait_for(
                gateway.bus.stream_figures(), STREAM_SEQ_TIMEOUT_S
            )
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
    cluster = CollectorRegistry()
    cluster.register(ClusterCollector(gateway, clock))
    stream = StreamCollector()
    cluster.register(stream)

    async def scrape() -> bytes:
        await refresh_stream_seq(gateway, stream)
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

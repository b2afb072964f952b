"""What every service process does around its own logic: settings, logs, traces,
metrics, a NATS connection that waits for the server, and a clean stop on SIGTERM."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from gpuloom.bus import EventBus
from gpuloom.bus.credentials import connect_options
from gpuloom.bus.jsapi import BASE_BUCKET
from gpuloom.config import Settings, load_settings
from gpuloom.natsserver import strip_credentials
from gpuloom.runtime.collector import tune_collector
from gpuloom.runtime.priority import lower_priority
from gpuloom.runtime.snapshots import SnapshotPolicy, Snapshotter
from gpuloom.telemetry import setup_tracing, shutdown_tracing
from gpuloom.telemetry.logging import setup_logging
from gpuloom.telemetry.metrics import serve_metrics

log = logging.getLogger(__name__)

Main = Callable[[Settings, EventBus, asyncio.Event], Awaitable[None]]


def snapshotter(settings: Settings, bus: EventBus, service: str) -> Snapshotter | None:
    """The service's snapshots as configured (None: turned off, replay the whole log)."""
    policy = SnapshotPolicy(settings.snapshot_every_events, settings.snapshot_every_s)
    if not policy.enabled:
        return None
    store = bus.snapshot_store(
        service, keep=settings.snapshot_keep, replicas=settings.stream_replicas
    )
    base = bus.snapshot_store(service, bucket=BASE_BUCKET)
    return Snapshotter(store, policy, base=base)


async def connect_bus(settings: Settings, name: str, attempts: int = 120) -> EventBus:
    """Connect to NATS as this process's identity (`GPULOOM_NATS_SEED_FILE`) and find
    the log, retrying while the server starts and until the operator's setup has
    created the log (no process creates it: `gpuloom.bus.provision`). A seed that
    cannot be read fails at once."""
    options = connect_options(settings)
    for attempt in range(1, attempts + 1):
        try:
            bus = await EventBus.connect(
                settings.nats_url, settings.stream, name=name, create=False, **options
            )
        except Exception as exc:
            if attempt == attempts:
                raise
            where = strip_credentials(settings.nats_url)
            log.warning(
                "waiting for NATS at %s: %s", where, str(exc).replace(settings.nats_url, where)
            )
            await asyncio.sleep(0.5)
            continue
        await bus.check_stream(settings.dedup_window_s, settings.stream_replicas)
        return bus
    raise AssertionError("unreachable")


def install_stop_handlers(stop: asyncio.Event) -> None:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)


async def until_stopped(
    work: Coroutine[Any, Any, EventBus], stop: asyncio.Event
) -> EventBus | None:
    """The result of `work`, or None (and `work` cancelled) if `stop` is set first."""
    task = asyncio.ensure_future(work)
    stopper = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({task, stopper}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopper.cancel()
    if task.done():
        return task.result()
    task.cancel()
    return None


def run_service(name: str, main: Main) -> None:
    """Run `main(settings, bus, stop)` as the process's whole life."""
    tune_collector()
    settings = load_settings()
    setup_logging(name, settings.log_level)
    lowered = lower_priority(name, settings.background_nice)  # before any thread starts
    if lowered is not None:
        log.info("%s", lowered)
    setup_tracing(name)
    serve_metrics(settings.metrics_port, settings.metrics_host)

    async def lifecycle() -> None:
        stop = asyncio.Event()
        install_stop_handlers(stop)
        bus = await until_stopped(connect_bus(settings, f"gpuloom-{name}"), stop)
        if bus is None:  # told to stop while NATS was still unreachable
            log.info("%s stopped before it could connect to %s", name, settings.nats_url)
            return
        log.info("%s connected to %s", name, settings.nats_url)
        try:
            await main(settings, bus, stop)
        finally:
            await bus.close()
            shutdown_tracing()
            log.info("%s stopped", name)

    profiled(name, lambda: run_loop(lifecycle()))


def run_loop(main: Coroutine[Any, Any, None]) -> None:
    """Run `main` on uvloop where it is installed (a faster loop), else on asyncio's."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


def profiled(name: str, body: Callable[[], None]) -> None:
    """Run `body`, under cProfile when GPULOOM_PROFILE_DIR is set (benchmarks)."""
    profile_dir = os.environ.get("GPULOOM_PROFILE_DIR")
    if not profile_dir:
        body()
        return
    import cProfile

    profiler = cProfile.Profile()
    profiler.enable()
    try:
        body()
    finally:
        profiler.disable()
        profiler.dump_stats(os.path.join(profile_dir, f"{name}-{os.getpid()}.prof"))

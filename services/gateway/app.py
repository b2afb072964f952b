"""The FastAPI application and its lifespan: connect to NATS (in the background, so
the API answers 503 rather than failing to start while NATS is away) and follow the
log: the gateway's own fold, and how far the read-model writer (`services.projector`)
has written the SQL rows (`services.gateway.readmodel`).

Every router but the `public` ones (/healthz, /readyz) is included behind
`authenticate`; errors answer as RFC 9457 problem details (`detail` says why)."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
from collections.abc import AsyncIterator

from fastapi import Depends, FastAPI
from starlette.middleware.trustedhost import TrustedHostMiddleware

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.runtime.service import connect_bus, snapshotter
from gpuloom.store.inline import inline_reads
from gpuloom.store.session import make_engine, make_sessionmaker
from services.gateway.accounts import routes as accounts
from services.gateway.apidocs import add_api_docs, add_openapi
from services.gateway.auth import authenticate, make_verifier
from services.gateway.cluster import policies, reservations
from services.gateway.cluster import routes as cluster
from services.gateway.events import routes as events
from services.gateway.freshness import Freshness
from services.gateway.jobs import batch, submit
from services.gateway.jobs import routes as jobs
from services.gateway.limits import BodyLimit
from services.gateway.metrics import add_metrics, serve_scrapes
from services.gateway.parts import Gateway
from services.gateway.problems import add_problem_handlers
from services.gateway.projections import deadletters
from services.gateway.projections import routes as projections
from services.gateway.readmodel import ReadModel
from services.gateway.stream_budget import StreamBudget
from services.gateway.ui.routes import add_dashboard
from services.gateway.usage import routes as usage
from services.gateway.webhooks.routes import router as webhooks_router

log = logging.getLogger(__name__)


async def attach_read_model(gateway: Gateway, bus: EventBus) -> ReadModel:
    """Give `gateway` its bus and a read model that knows where the log ends now: its
    reads say they are stale ("starting") until the fold and the rows reach that point."""
    gateway.bus = bus
    snapshots = snapshotter(gateway.settings, bus, "gateway")
    read_model = ReadModel(bus, gateway.sessions, snapshots=snapshots)
    gateway.start_seq = read_model.stream_seq = await bus.last_seq()
    gateway.read_model = read_model
    return read_model


def allowed_hosts(settings: Settings) -> list[str]:
    """The `Host` names the gateway answers (`Settings.gateway_allowed_hosts`)."""
    if settings.gateway_allowed_hosts is not None:
        return settings.gateway_allowed_hosts
    try:
        loopback = ipaddress.ip_address(settings.gateway_host).is_loopback
    except ValueError:
        loopback = settings.gateway_host == "localhost"
    return ["localhost", "127.0.0.1", "::1", "[::1]"] if loopback else ["*"]


async def _connect_and_follow(gateway: Gateway, stop: asyncio.Event) -> None:
    bus = await connect_bus(gateway.settings, "gpuloom-gateway", attempts=1_000_000)
    read_model = await attach_read_model(gateway, bus)
    log.info("gateway connected to %s", gateway.settings.nats_url)
    await read_model.run(stop)


def create_app(settings: Settings) -> FastAPI:
    engine = make_engine(settings.database_url)
    gateway = Gateway(
        settings=settings,
        sessions=inline_reads(settings.database_url) or make_sessionmaker(engine),
        verifier=make_verifier(settings),
        stream_budget=StreamBudget(
            per_user=settings.streams_per_user,
            total=settings.streams_total,
            replays_per_user=settings.stream_replays_per_user,
            replays_total=settings.stream_replays_total,
            replays_per_minute=settings.stream_replays_per_minute,
            replay_behind=settings.stream_replay_behind,
        ),
    )

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        stop = asyncio.Event()
        task = asyncio.create_task(_connect_and_follow(gateway, stop))
        scrapes = None
        if settings.metrics_port:
            scrapes = await serve_scrapes(scrape, settings.metrics_host, settings.metrics_port)
        try:
            yield
        finally:
            if scrapes is not None:
                scrapes.close()
            stop.set()
            try:
                await asyncio.wait_for(task, 15)  # its last snapshot: FINAL_WRITE_TIMEOUT_S
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
            except Exception:
                log.exception("the read model stopped with an error")
            if gateway.bus is not None:
                await gateway.bus.close()
            await engine.dispose()

    app = FastAPI(
        title="gpuloom",
        version="0.1.0",
        summary="Event-sourced GPU cluster scheduler: REST gateway",
        lifespan=lifespan,
        docs_url=None,  # served by add_api_docs, with assets that need no internet
        redoc_url=None,
        telemetry={"metrics": False, "logs": False, "operation_spans": False},
    )
    app.state.gateway = gateway
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(Freshness, gateway=gateway)
    app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts(settings))

    add_problem_handlers(app)

    authenticated = [Depends(authenticate)]
    for router in (
        submit.router,
        batch.router,
        jobs.router,
        cluster.router,
        usage.router,
        accounts.router,
        policies.router,
        reservations.router,
        projections.router,
        events.router,
        webhooks_router,
        deadletters.router,
    ):
        app.include_router(router, dependencies=authenticated)
    app.include_router(cluster.public)
    app.include_router(projections.public)
    add_api_docs(app)
    add_dashboard(app)  # /ui: static pages, outside `authenticate`; their data calls carry a token
    add_openapi(app)
    scrape = add_metrics(
        app, gateway, dependencies=[] if settings.metrics_public else authenticated
    )
    return app

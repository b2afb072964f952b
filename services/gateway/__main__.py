"""Composition root of the gateway: settings, logs, traces, then uvicorn with the
connection budget (`services.gateway.connections`)."""

from __future__ import annotations

import logging

import uvicorn

from gpuloom.config import Settings, load_settings
from gpuloom.runtime.collector import tune_collector
from gpuloom.runtime.service import profiled
from gpuloom.telemetry import setup_tracing
from gpuloom.telemetry.logging import setup_logging
from services.gateway.app import create_app
from services.gateway.connections import ConnectionBudget, fd_budget, guarded_protocol

log = logging.getLogger("services.gateway")


def connection_budget(settings: Settings) -> ConnectionBudget:
    """The budget every connection is held to, within the descriptors this process has."""
    most, fds = fd_budget(settings.gateway_max_connections, settings.gateway_fd_reserve)
    budget = ConnectionBudget(
        max_connections=most,
        per_client=min(settings.gateway_max_connections_per_client, most),
        idle_most=max(1, int(most * settings.gateway_idle_share)),
        header_timeout_s=settings.gateway_header_timeout_s,
        body_timeout_s=settings.gateway_body_timeout_s,
    )
    log.info(
        "connections: at most %d (%d file descriptors, %d kept for the rest), %d per "
        "client address, %d idle; headers within %g s, a body within %g s",
        budget.max_connections,
        fds,
        settings.gateway_fd_reserve,
        budget.per_client,
        budget.idle_most,
        budget.header_timeout_s,
        budget.body_timeout_s,
    )
    return budget


def entrypoint(argv: list[str] | None = None) -> None:
    tune_collector()
    settings = load_settings()
    setup_logging("gateway", settings.log_level)
    setup_tracing("gateway")
    app = create_app(settings)
    config = uvicorn.Config(
        app,
        host=settings.gateway_host,
        port=settings.gateway_port,
        http=guarded_protocol(connection_budget(settings)),
        log_config=None,
        access_log=False,
        timeout_keep_alive=settings.gateway_keepalive_s,  # type: ignore[arg-type]
        timeout_graceful_shutdown=5,
    )
    server = uvicorn.Server(config)
    profiled("gateway", server.run)
    if not server.started:  # as uvicorn.run: the port was taken, say
        raise SystemExit(3)


if __name__ == "__main__":
    entrypoint()

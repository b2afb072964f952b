"""Composition root of the gateway: settings, logs, traces, then uvicorn."""

from __future__ import annotations

import uvicorn

from gpuloom.config import load_settings
from gpuloom.runtime.collector import tune_collector
from gpuloom.runtime.service import profiled
from gpuloom.telemetry import setup_tracing
from gpuloom.telemetry.logging import setup_logging
from services.gateway.app import create_app


def entrypoint(argv: list[str] | None = None) -> None:
    tune_collector()
    settings = load_settings()
    setup_logging("gateway", settings.log_level)
    setup_tracing("gateway")
    app = create_app(settings)
    profiled(
        "gateway",
        lambda: uvicorn.run(
            app,
            host=settings.gateway_host,
            port=settings.gateway_port,
            log_config=None,
            access_log=False,
            timeout_graceful_shutdown=5,
        ),
    )


if __name__ == "__main__":
    entrypoint()

"""OpenTelemetry setup and W3C trace context in and out of NATS headers."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from opentelemetry import propagate, trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

log = logging.getLogger(__name__)

_provider: TracerProvider | None = None


def setup_tracing(service: str, processor: SpanProcessor | None = None) -> TracerProvider:
    """Install a tracer provider named after `service`.

    Spans go to `processor` when given (tests), else to OTLP/HTTP when
    `OTEL_EXPORTER_OTLP_ENDPOINT` (or the traces-specific variable) is set, else
    nowhere: spans are still created, so trace ids appear in logs.
    """
    global _provider
    provider = TracerProvider(resource=Resource.create({"service.name": f"gpuloom-{service}"}))
    if processor is not None:
        provider.add_span_processor(processor)
    elif os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
    ):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        log.info("exporting traces over OTLP/HTTP")
    trace.set_tracer_provider(provider)
    _provider = provider
    return provider


def shutdown_tracing() -> None:
    if _provider is not None:
        _provider.shutdown()


def tracer(name: str) -> trace.Tracer:
    return trace.get_tracer(name)


def inject(headers: dict[str, str], context: Context | None = None) -> dict[str, str]:
    """Add `traceparent` (and `tracestate`) of `context` or the current span to `headers`."""
    propagate.inject(headers, context=context)
    return headers


def extract(headers: Mapping[str, str] | None) -> Context:
    """The remote span context carried in message headers (empty context when none)."""
    return propagate.extract(dict(headers or {}))


def current_trace_id() -> str | None:
    ctx = trace.get_current_span().get_span_context()
    return format(ctx.trace_id, "032x") if ctx.is_valid else None

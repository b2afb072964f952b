"""Reads say how fresh they are: every answer to a `/v1` read carries the projection's
lag, and says it is stale while the gateway catches up with the log.

The read model (SQL rows, the folded state) trails the log. After a start the gateway
replays what it has not written yet; while it does, or while it falls behind (the
database is slow or away), a read answers from old data. A load balancer learns that
from /readyz; a client that reaches this gateway anyway learns it from the answer
itself, never silently:

- `Gpuloom-Projection-Lag: N`: events of the log, as last seen, not yet in the read model;
- `Gpuloom-Stale: starting` while the replay after the start has not reached the end
  of the log as it was when the gateway connected; `lagging` while the lag is over
  `ready_max_lag`; `unavailable` while the gateway has no connection to the log yet.

The figures are the read model's own (no call to NATS per request): the log's end is
learned at connection and then from each delivery and each /readyz or /metrics probe.
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.parts import Gateway
from services.gateway.reads import Reads

LAG_HEADER = "gpuloom-projection-lag"
STALE_HEADER = "gpuloom-stale"


class Freshness:
    """ASGI middleware: the freshness headers on every answer to a GET under /v1/
    (`ProgressReads.staleness`)."""

    def __init__(self, app: ASGIApp, gateway: Gateway) -> None:
        self.app = app
        self.reads = Reads(gateway)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] != "http"
            or scope["method"] != "GET"
            or not str(scope["path"]).startswith("/v1/")
        ):
            await self.app(scope, receive, send)
            return

        async def send_with_freshness(message: Message) -> None:
            if message["type"] == "http.response.start":
                lag, stale = self.reads.progress.staleness()
                headers = list(message.get("headers", []))
                if lag is not None:
                    headers.append((LAG_HEADER.encode(), str(lag).encode()))
                if stale is not None:
                    headers.append((STALE_HEADER.encode(), stale.encode()))
                message = {**message, "headers": headers}
            await send(message)

        await self.app(scope, receive, send_with_freshness)

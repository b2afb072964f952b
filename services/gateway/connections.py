"""The gateway's connections: how many, from whom, and how long a request may take to
arrive (issue #36: 20,000 half-sent requests held every file descriptor).

uvicorn reads requests with no header or body timeout and accepts connections until
the process runs out of descriptors. `guarded_protocol` gives it an HTTP protocol
(httptools', extended) that holds every connection to a `ConnectionBudget`:

* **Per client address**: at most `per_client` open connections; one more is answered
  429 with `Retry-After` and closed.
* **Idle connections**: a connection with no request in progress (just opened, still
  sending its headers, or kept alive between requests) is *idle*. At most `idle_most`
  (a share of `max_connections`) are idle at once; a new one past that closes the
  oldest idle one, which has had the longest to send a request. So clients that send
  no request, with a token or without, hold no more than that share, and cannot keep
  out a client that sends its request at once.
* **Timeouts**: headers must arrive within `header_timeout_s` of the connection (or of
  a kept-alive request's first byte), else 408 and closed; the body within
  `body_timeout_s` after them, else the connection is closed (the route sees the
  client gone). A request in progress is not idle: a long event stream is capped by
  the event stream's own budgets, not here.
* **All connections**: at most `max_connections`; past it, with no idle one to close,
  503 with `Retry-After`. `fd_budget` lowers it to what the process's descriptor limit
  leaves after a reserve for NATS, the database and files.

The refusals are written by the protocol itself, before any request is parsed: they
cost no task, no route and no log line per connection (a count, in the warning
logged at most once a minute, and in `/metrics`: `gpuloom_gateway_connections` and
`gpuloom_gateway_connections_refused_total` by reason).
"""

from __future__ import annotations

import logging
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any

import orjson
from prometheus_client import Counter as MetricCounter
from prometheus_client import Gauge
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from services.gateway.problems import MEDIA_TYPE, problem_body

log = logging.getLogger(__name__)

#: How often a count of refused connections is logged, at most (seconds).
REFUSALS_LOGGED_EVERY_S = 60.0

CONNECTIONS = Gauge(
    "gpuloom_gateway_connections",
    "Open connections of the gateway; idle: with no request in progress",
    ["state"],
)
REFUSED = MetricCounter(
    "gpuloom_gateway_connections_refused_total",
    "Connections the gateway refused or closed to keep its connection budget",
    ["reason"],
)


@dataclass
class ConnectionBudget:
    """The limits, and the connections open now (shared by every protocol instance)."""

    max_connections: int
    per_client: int
    idle_most: int
    header_timeout_s: float
    body_timeout_s: float
    open_by_client: Counter[str] = field(default_factory=Counter)
    #: Idle connections, oldest first (a dict keeps insertion order).
    idle: dict[GuardedHttpTools, None] = field(default_factory=dict)
    open_count: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    _logged_at: float = 0.0

    def refusal(self, client: str) -> tuple[int, str] | None:
        """The status and reason a new connection from `client` is refused with, or
        None: it may open (after `make_room`)."""
        if self.open_by_client[client] >= self.per_client:
            return 429, f"more than {self.per_client} connections from one address"
        if self.open_count >= self.max_connections and not self.idle:
            return 503, f"the gateway holds {self.max_connections} connections"
        return None

    def __post_init__(self) -> None:
        """Read at scrape time (the process's one budget): nothing on the hot path."""
        CONNECTIONS.labels("open").set_function(lambda: self.open_count)
        CONNECTIONS.labels("idle").set_function(lambda: len(self.idle))

    def make_room(self) -> None:
        """Close the oldest idle connections while too many are open or idle."""
        while self.idle and (
            len(self.idle) >= self.idle_most or self.open_count >= self.max_connections
        ):
            next(iter(self.idle)).close_idle()  # leaves `idle` and the counts
            self.count("idle_closed")

    def count(self, why: str) -> None:
        REFUSED.labels(why).inc()
        self.refused[why] += 1
        now = time.monotonic()
        if now - self._logged_at >= REFUSALS_LOGGED_EVERY_S:
            self._logged_at = now
            log.warning("connections refused or closed in the last minute: %s", dict(self.refused))
            self.refused.clear()


def fd_budget(wanted: int, reserve: int) -> tuple[int, int]:
    """Raise the soft descriptor limit to the hard one; the connections that leave
    `reserve` descriptors free (at most `wanted`), and the soft limit now."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    return max(8, min(wanted, soft - reserve)), soft


def _refuse(status: int, reason: str) -> bytes:
    """A whole answer, problem details as every error of the gateway (problems.py)."""
    body = orjson.dumps(problem_body(status, reason))
    return b"".join(
        [
            b"HTTP/1.1 %d %s\r\n" % (status, HTTPStatus(status).phrase.encode()),
            b"content-type: %s\r\n" % MEDIA_TYPE.encode(),
            b"content-length: %d\r\n" % len(body),
            b"retry-after: 1\r\n" if status != 408 else b"",
            b"connection: close\r\n\r\n",
            body,
        ]
    )


class GuardedHttpTools(HttpToolsProtocol):
    """httptools' protocol held to `budget` (set on the subclass `guarded_protocol` makes)."""

    budget: ConnectionBudget

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._address = ""
        self._counted = False
        self._deadline: Any = None

    # -- the connection ------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        budget = self.budget
        self._address = self.client[0] if self.client else ""
        refused = budget.refusal(self._address)
        if refused is not None:
            budget.count("per_client" if refused[0] == 429 else "full")
            transport.write(_refuse(*refused))
            transport.close()
            return
        budget.make_room()
        budget.open_count += 1
        budget.open_by_client[self._address] += 1
        self._counted = True
        self._become_idle(self.budget.header_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        self._uncount()
        super().connection_lost(exc)

    def _uncount(self) -> None:
        if not self._counted:
            return
        self._counted = False
        budget = self.budget
        budget.open_count -= 1
        budget.open_by_client[self._address] -= 1
        if budget.open_by_client[self._address] <= 0:
            del budget.open_by_client[self._address]
        budget.idle.pop(self, None)

    # -- a request's progress ------------------------------------------------------
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm(self.budget.header_timeout_s, self._headers_late)

    def on_headers_complete(self) -> None:
        self.budget.idle.pop(self, None)
        self._arm(self.budget.body_timeout_s, self._body_late)
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        super().on_response_complete()
        if not pipelined and self._counted and not self.transport.is_closing():
            self._become_idle(None)  # uvicorn's keep-alive timeout closes it

    # -- helpers -------------------------------------------------------------------
    def _become_idle(self, timeout_s: float | None) -> None:
        self.budget.idle[self] = None
        if timeout_s is not None:
            self._arm(timeout_s, self._headers_late)

    def close_idle(self) -> None:
        """Close this idle connection to make room: it stops counting at once."""
        self._disarm()
        self._uncount()
        if not self.transport.is_closing():
            self.transport.close()

    def _arm(self, after_s: float, then: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(after_s, then)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.budget.count("header_timeout")
            self.transport.write(
                _refuse(408, f"no complete request headers in {self.budget.header_timeout_s:g} s")
            )
            self.transport.close()

    def _body_late(self) -> None:
        self._deadline = None
        if not self.transport.is_closing():
            self.budget.count("body_timeout")
            self.transport.close()


def guarded_protocol(budget: ConnectionBudget) -> type[GuardedHttpTools]:
    """The protocol class for uvicorn's `http=`, every connection held to `budget`."""
    return type("GatewayHttpProtocol", (GuardedHttpTools,), {"budget": budget})

"""Structured logs: one line per record, with the service and the current trace id.

Secrets never reach a log line (a job on a node, or anyone who reads the logs, would
read them there): callers log ids and hosts, not URLs,
tokens or environments, and every message (and traceback) is scrubbed once more of
what slips through: a URL's user and password, a bearer token, anything shaped like a
JWT. httpx's request lines (full URLs, a webhook's path included) are not logged.
"""

from __future__ import annotations

import logging
import re
import sys

import orjson

from gpuloom.telemetry import current_trace_id

_SECRETS = (
    (re.compile(r"(?<=://)[^/@\s:]+:[^/@\s]*@"), "***@"),  # scheme://user:password@host
    (re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/=-]+"), r"\1***"),
    (re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*"), "<jwt>"),
)


def scrub(text: str) -> str:
    """`text` without the secrets a log line must not carry (see the module doc)."""
    for pattern, replacement in _SECRETS:
        text = pattern.sub(replacement, text)
    return text


class JsonFormatter(logging.Formatter):
    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        doc = {
            "t": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname.lower(),
            "service": self.service,
            "logger": record.name,
            "msg": scrub(record.getMessage()),
        }
        trace_id = current_trace_id()
        if trace_id:
            doc["trace_id"] = trace_id
        if record.exc_info:
            doc["exc"] = scrub(self.formatException(record.exc_info))
        return orjson.dumps(doc).decode()


def setup_logging(service: str, level: str = "INFO") -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter(service))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("nats").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # its INFO lines are whole URLs

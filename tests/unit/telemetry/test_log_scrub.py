"""Log lines carry no secrets: a URL's password, a bearer token, a JWT are scrubbed from
every message and traceback, whatever a caller passed (issue #36)."""

from __future__ import annotations

import logging
import sys

import orjson
import pytest

from gpuloom.telemetry.logging import JsonFormatter, scrub

JWT = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "connected to nats://admin:s3cr3t@127.0.0.1:4222",
            "connected to nats://***@127.0.0.1:4222",
        ),
        ("postgresql+asyncpg://gpu:pw@db/gpuloom", "postgresql+asyncpg://***@db/gpuloom"),
        ("Authorization: Bearer abc.def-ghi", "Authorization: Bearer ***"),
        (f"token {JWT} refused", "token <jwt> refused"),
        ("https://hooks.example/path?x=1 stays", "https://hooks.example/path?x=1 stays"),
    ],
    ids=["nats password", "database password", "bearer", "jwt", "nothing secret"],
)
def test_secrets_are_scrubbed(text: str, expected: str) -> None:
    assert scrub(text) == expected


def test_the_formatter_scrubs_message_and_traceback() -> None:
    formatter = JsonFormatter("test")
    try:
        raise RuntimeError(f"could not use {JWT}")
    except RuntimeError:
        record = logging.LogRecord(
            "x", logging.ERROR, __file__, 1, "to %s", ("nats://u:p@h",), exc_info=True
        )
        record.exc_info = sys.exc_info()
    line = orjson.loads(formatter.format(record))
    assert line["msg"] == "to nats://***@h"
    assert JWT not in line["exc"] and "<jwt>" in line["exc"]

"""The pure core imports nothing of the outside world (style: a pure core and an I/O shell)."""

from __future__ import annotations

import json
import subprocess
import sys

PURE = [
    "gpuloom.events",
    "gpuloom.state",
    "gpuloom.state.snapshot",
    "gpuloom.placement",
    "gpuloom.decide",
    "gpuloom.decide.admission",
    "gpuloom.decide.queueing",
    "gpuloom.queueing.order",
    "gpuloom.queueing.classes",
    "gpuloom.decide.accounting",
    "gpuloom.decide.inventory",
    "gpuloom.testing.builders",
    "gpuloom.auth.policy",
]
FORBIDDEN = ["nats", "sqlalchemy", "fastapi", "opentelemetry", "httpx", "asyncpg", "aiosqlite"]

PROBE = """
import importlib, json, sys
for name in {pure!r}:
    importlib.import_module(name)
print(json.dumps(sorted(sys.modules)))
"""


def test_the_pure_core_imports_no_bus_database_web_or_telemetry_library() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PROBE.format(pure=PURE)],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    loaded = json.loads(result.stdout)
    assert set(PURE) <= set(loaded)
    offenders = sorted(
        name for name in loaded if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)
    )
    assert offenders == []

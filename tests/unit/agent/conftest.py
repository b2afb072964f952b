"""Fixtures of the agent's unit tests: an in-memory log and a run folder root."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_fakelog import FakeLog


@pytest.fixture
def fake_log() -> FakeLog:
    log = FakeLog()
    log.node("node-a", gpus=2)
    return log


@pytest.fixture
def run_root(tmp_path: Path) -> Iterator[Path]:
    """A run folder root; shims a test leaves behind are killed and reaped after it."""
    root = tmp_path / "runs"
    yield root
    for pid_file in root.glob("*/*/*/pid"):
        try:
            pid = int(pid_file.read_text())
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except (OSError, ValueError):
            continue
        if b"gpuloom-shim" in cmdline and os.fsencode(str(pid_file.parent)) in cmdline:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)

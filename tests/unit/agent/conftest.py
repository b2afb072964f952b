"""Fixtures of the agent's unit tests: the log kept in memory, with node-a registered,
and a run folder root."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest
from agent_events import register

from gpuloom.testing.memlog import MemoryLog


@pytest.fixture
def log() -> MemoryLog:
    log = MemoryLog()
    register(log, "node-a", gpus=2)
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

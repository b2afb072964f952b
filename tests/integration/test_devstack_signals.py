"""`make run` (`python -m gpuloom.devstack`) leaves no process behind, however it ends.

The launcher runs as an operator runs it, `make run | tee log` in a terminal: the shell,
the launcher and tee share one process group, the one a terminal's Ctrl-C signals. The
processes of the stack are found by the test's data dir, which each of them carries in
its command line (nats-server's config file) or its environment (`GPULOOM_DATA_DIR`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuloom.devstack import REPO_ROOT, NatsServer, free_port, wait_http

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux /proc"),
]


def stack_processes(data_dir: Path) -> dict[int, str]:
    """Live (not zombie) processes that name `data_dir`: pid -> command line."""
    needle = str(data_dir).encode()
    found = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        proc = Path("/proc") / entry
        try:
            cmdline = (proc / "cmdline").read_bytes()
            environ = (proc / "environ").read_bytes()
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:  # ended meanwhile
            continue
        if state != "Z" and (needle in cmdline or needle in environ):
            found[int(entry)] = cmdline.replace(b"\0", b" ").decode(errors="replace").strip()
    return found


def wait_until_gone(data_dir: Path, timeout: float) -> dict[int, str]:
    deadline = time.monotonic() + timeout
    while (left := stack_processes(data_dir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


@contextlib.contextmanager
def make_run_under_tee(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """`python -m gpuloom.devstack 2>&1 | tee LOG` in a process group of its own, up and
    answering; yields (the shell, the data dir, the tee'd log). Whatever the test leaves
    running of the stack is killed afterwards."""
    data_dir = tmp_path / "stack"
    log = tmp_path / "make-run.log"
    gateway_port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPULOOM_")}
    env |= {
        "GPULOOM_DATA_DIR": str(data_dir),
        "GPULOOM_GATEWAY_PORT": str(gateway_port),
        "GPULOOM_NATS_PORT": str(free_port()),
    }
    shell = subprocess.Popen(
        ["bash", "-c", f'"{sys.executable}" -m gpuloom.devstack 2>&1 | tee "{log}"'],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        start_new_session=True,  # its own group, as a terminal's foreground job
    )
    try:
        wait_http(f"http://127.0.0.1:{gateway_port}/healthz", timeout=90)
        deadline = time.monotonic() + 30  # the launcher polls the gateway too, then says so
        while "gpuloom is running" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        running = stack_processes(data_dir).values()
        assert sum(" -m services." in command for command in running) == 8, running
        assert any("nats-server" in command for command in running), running
        yield shell, data_dir, log
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(shell.pid, signal.SIGKILL)
        for pid in stack_processes(data_dir):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        shell.wait(10)


def test_ctrl_c_under_a_pipe_stops_every_service_and_nats(tmp_path: Path) -> None:
    """Ctrl-C kills tee as well, usually first (tee dies at once, the launcher has to
    wake up): the launcher's next print fails (broken pipe), and the stop must not
    depend on it. The test makes that order certain: tee first, then the group."""
    with make_run_under_tee(tmp_path) as (shell, data_dir, log):
        assert "gpuloom is running" in log.read_text()
        [tee] = [pid for pid, cmd in stack_processes(data_dir).items() if cmd.startswith("tee")]
        os.kill(tee, signal.SIGINT)
        while tee in stack_processes(data_dir):
            time.sleep(0.05)
        os.killpg(shell.pid, signal.SIGINT)
        left = wait_until_gone(data_dir, timeout=30)
        assert not left, f"left running after Ctrl-C: {left}"


def test_services_die_with_a_killed_launcher(tmp_path: Path) -> None:
    """SIGKILL leaves the launcher no chance to stop anything: the kernel's parent-death
    signal stops the services and nats-server."""
    with make_run_under_tee(tmp_path) as (_shell, data_dir, _log):
        launcher = [
            pid
            for pid, command in stack_processes(data_dir).items()
            if "-m gpuloom.devstack" in command and not command.startswith("bash")
        ]
        assert len(launcher) == 1, stack_processes(data_dir)
        os.kill(launcher[0], signal.SIGKILL)
        left = wait_until_gone(data_dir, timeout=30)
        assert not left, f"left running after the launcher was killed: {left}"


@pytest.mark.parametrize(
    ("sync", "interval_ns", "always"),
    [("1s", 1_000_000_000, False), ("always", None, True)],
    ids=["the default fsyncs every second", "strict mode fsyncs every write"],
)
def test_nats_server_runs_with_the_declared_sync_interval(
    tmp_path: Path, sync: str, interval_ns: int | None, always: bool
) -> None:
    server = NatsServer(tmp_path / "nats", sync=sync).start()
    try:
        url = f"http://127.0.0.1:{server.monitor_port}"
        with urllib.request.urlopen(f"{url}/jsz", timeout=5) as response:
            config = json.load(response)["config"]
        with urllib.request.urlopen(f"{url}/varz", timeout=5) as response:
            varz = json.load(response)
    finally:
        server.stop()
    assert config.get("sync_always", False) is always
    if interval_ns is not None:
        assert config["sync_interval"] == interval_ns
    assert varz["max_payload"] == 1024 * 1024

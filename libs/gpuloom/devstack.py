"""The embedded stack: a local nats-server, SQLite, every service as its own process.

`make run` calls `main()`; the integration tests and benchmarks use `NatsServer`
and `Stack` directly. Nothing here is used in production: there each service is
started by its own supervisor (compose, Kubernetes).

Every child (nats-server and each service) runs in its own session, so that a Ctrl-C
reaches only the launcher, which stops the services first and the log they write to
last. On Linux each child also gets SIGTERM if the launcher dies (`PR_SET_PDEATHSIG`),
so that no way of ending the launcher leaves services behind.

The launcher supervises what it started: a service that dies is started again, and so is
its own nats-server, on the same port and store with the same identities
(`gpuloom.supervision`).
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import yaml

from gpuloom.bus.identities import SERVICES as BUS_SERVICES
from gpuloom.bus.keyring import Keyring, write_private
from gpuloom.bus.provision import provision_at, run_blocking
from gpuloom.bus.streams import Expected
from gpuloom.kube.scheduler_config import kube_banner
from gpuloom.natsserver import (
    DEFAULT_NATS_SYNC,
    NATS_MAX_PAYLOAD,
    NatsServer,
    die_with_parent,
    free_port,
    nats_config,
    nats_server_binary,
    port_is_free,
    serving,
    strip_credentials,
)
from gpuloom.supervision import say, supervise

__all__ = [
    "DEFAULT_NATS_SYNC",
    "NATS_MAX_PAYLOAD",
    "REPO_ROOT",
    "SERVICES",
    "NatsServer",
    "Stack",
    "die_with_parent",
    "free_port",
    "main",
    "migrate",
    "nats_config",
    "nats_server_binary",
    "port_is_free",
    "wait_http",
]

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVICES = (
    "inventory",
    "admission",
    "queue",
    "placement",
    "dispatch",
    "accounting",
    "projector",
    "gateway",
    "webhooks",
)
#: The Kubernetes services: started beside the others when GPULOOM_KUBECONFIG names a
#: cluster whose GPUs gpuloom schedules (docs/kubernetes.md).
KUBE_SERVICES = ("extender", "kubewatch")
assert set(SERVICES) | set(KUBE_SERVICES) == set(BUS_SERVICES), "every service has its identity"
#: The operator token the banner prints lives this long (`gpuloom token issue` makes more).
BANNER_TOKEN_TTL_S = 8 * 3600


@dataclass
class Stack:
    """The service processes of one gpuloom stack, sharing one environment.

    With a `server` that has identities (`NatsServer(keyring=...)`), each process
    connects as its own: a service as the identity of its name, an agent as one
    granted exactly the nodes it serves (`start(..., nodes=...)`); its environment
    gets `GPULOOM_NATS_SEED_FILE`, and the shared URL carries no credentials.
    """

    env: dict[str, str]
    log_dir: Path
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    commands: dict[str, list[str]] = field(default_factory=dict)
    server: NatsServer | None = None
    #: Environment of one process on top of `env` (its identity).
    envs: dict[str, dict[str, str]] = field(default_factory=dict)
    #: The log, the view and the services' buckets exist (`provision`).
    provisioned: bool = False

    @classmethod
    def for_urls(
        cls,
        nats_url: str,
        database_url: str,
        data_dir: Path,
        extra: Mapping[str, str] = {},
        server: NatsServer | None = None,
    ) -> Stack:
        """A stack on these URLs. `server`: the nats-server whose identities the
        processes take; default, the one this process runs at `nats_url`, if any (an
        admin URL's password is then dropped: no process needs it)."""
        server = server or serving(nats_url)
        if server is not None and server.keyring is not None:
            nats_url = strip_credentials(nats_url)
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
        return cls(env=env, log_dir=log_dir, server=server)

    def start(
        self,
        name: str,
        module: str | None = None,
        args: Sequence[str] = (),
        nodes: Sequence[str] | None = None,
        env: Mapping[str, str] | None = None,
    ) -> None:
        """Start service `name` (`python -m services.<module>`), logging to log_dir/name.log.
        `nodes`: of an agent, the nodes it serves (the rights of its identity); `env`:
        variables of this process only."""
        module = module or name
        command = [sys.executable, "-m", f"services.{module}", *args]
        self.commands[name] = command
        self.envs[name] = {**(env or {}), **self.identity_env(name, module, nodes)}
        self.provision()
        self.spawn(name)

    def provision(self) -> None:
        """Create, as the admin, the log, the per-node view and the services' snapshot
        buckets where missing: no process may create them (`gpuloom.bus.provision`).
        Once per stack."""
        if self.provisioned:
            return
        url = self.server.admin_url if self.server is not None else self.env["GPULOOM_NATS_URL"]
        window, replicas = (
            self.env.get("GPULOOM_DEDUP_WINDOW_S"),
            self.env.get("GPULOOM_STREAM_REPLICAS"),
        )
        expected = Expected(float(window) if window else None, int(replicas) if replicas else None)
        stream = self.env.get("GPULOOM_STREAM", "GPULOOM")
        run_blocking(provision_at(url, stream, expected=expected))
        self.provisioned = True

    def identity_env(self, name: str, module: str, nodes: Sequence[str] | None) -> dict[str, str]:
        """The environment that makes process `name` connect as its own identity."""
        if self.server is None or self.server.keyring is None:
            return {}
        if module == "agent":
            if not nodes:
                raise ValueError(f"agent {name}: name the nodes it serves (its bus identity)")
            seed = self.server.grant_agent(name, nodes)
        elif module in BUS_SERVICES:
            seed = self.server.seed_file(module)
        else:
            raise ValueError(f"{name}: services.{module} has no identity on the bus")
        return {"GPULOOM_NATS_SEED_FILE": str(seed)}

    def spawn(self, name: str) -> None:
        """Start service `name` with its command and environment, its output to its log."""
        log = open(self.log_dir / f"{name}.log", "ab")  # noqa: SIM115
        self.processes[name] = subprocess.Popen(
            self.commands[name],
            env={**self.env, **self.envs.get(name, {})},
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
        self.spawn(name)

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


def inventory_nodes(path: Path) -> list[str]:
    """The node names an agent's inventory file declares (its identity's nodes)."""
    doc = yaml.safe_load(path.read_text()) or {}
    return [str(node["name"]) for node in doc.get("nodes", [])]


def operator_token(data_dir: Path) -> str:
    """A bearer token for the gateway, as operator `admin`, signed with the stack's
    secret (`<data_dir>/auth/jwt.key`, made on first start)."""
    from gpuloom.auth import OPERATOR, ensure_secret, issue_token

    secret = ensure_secret(data_dir / "auth" / "jwt.key")
    now = datetime.now(UTC)
    return issue_token(secret, "admin", now=now, ttl_s=BANNER_TOKEN_TTL_S, roles=[OPERATOR])


def main() -> None:
    """`make run`: the whole stack on embedded defaults, until Ctrl-C (or SIGTERM, SIGHUP).

    Whatever ends it, the services are stopped before the launcher exits: the stop never
    depends on writing to stdout (`make run | tee log`: Ctrl-C kills tee too, and every
    later print would raise BrokenPipeError)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _interrupt)  # SIGINT too, even where a parent ignored it
    data_dir = Path(os.environ.get("GPULOOM_DATA_DIR", ".gpuloom")).resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    keep_private(data_dir)
    nats: NatsServer | None = None
    stack: Stack | None = None
    answering: tuple[str, str] | None = None  # the gateway and a token, once it answers
    try:
        kubeconfig = kube_switch(os.environ)
        inventories = (
            {}  # Kubernetes supplies the nodes: no simulated ones beside them
            if kubeconfig is not None
            else {f"agent-{Path(i).stem}": REPO_ROOT / i for i in DEV_INVENTORIES}
        )
        nats_url = os.environ.get("GPULOOM_NATS_URL")
        admin_url = nats_url
        if not nats_url:
            keyring = Keyring(data_dir / "bus")
            for agent, inventory in inventories.items():  # before the server's first load
                keyring.add_agent(agent, inventory_nodes(inventory))
            port = int(os.environ.get("GPULOOM_NATS_PORT", "4250"))
            nats = NatsServer(
                data_dir / "nats",
                port=port if port_is_free(port) else None,
                log_file=data_dir / "nats.log",
                sync=os.environ.get("GPULOOM_NATS_SYNC", DEFAULT_NATS_SYNC),
                keyring=keyring,
            )
            nats.start()
            nats_url, admin_url = nats.url, nats.admin_url
        database_url = os.environ.get(
            "GPULOOM_DATABASE_URL", f"sqlite+aiosqlite:///{data_dir}/gpuloom.db"
        )
        gateway_port = int(os.environ.get("GPULOOM_GATEWAY_PORT", "8080"))
        gateway_url = f"http://127.0.0.1:{gateway_port}"
        # the admin URL, for `gpuloom audit` and `gpuloom log` run from this folder
        urls = {"nats_url": admin_url, "database_url": database_url, "gateway_url": gateway_url}
        write_private(data_dir / "stack.json", json.dumps(urls).encode())
        migrate(database_url)
        stack = Stack.for_urls(
            nats_url, database_url, data_dir, {"GPULOOM_GATEWAY_PORT": str(gateway_port)}, nats
        )
        for name in SERVICES:
            stack.start(name)
        if kubeconfig is not None:
            for name in KUBE_SERVICES:
                stack.start(name, env={"GPULOOM_KUBECONFIG": str(kubeconfig)})
        for agent, inventory in inventories.items():
            nodes = inventory_nodes(inventory)
            stack.start(agent, "agent", ["--inventory", str(inventory)], nodes=nodes)
        wait_http(f"{gateway_url}/healthz")
        sync = nats.sync if nats else "set by that server"
        token = operator_token(data_dir)
        say(BANNER.format(url=gateway_url, nats=nats_url, data=data_dir, sync=sync, token=token))
        if kubeconfig is not None:
            port = int(os.environ.get("GPULOOM_EXTENDER_PORT", "8090"))
            say(kube_banner(str(kubeconfig), port))
        answering = (gateway_url, token)
        supervise(stack, nats)
    except KeyboardInterrupt:
        pass
    finally:
        shutdown(stack, nats, answering)


def kube_switch(environ: Mapping[str, str]) -> Path | None:
    """The kubeconfig of `GPULOOM_KUBECONFIG`, when gpuloom is to schedule a Kubernetes
    cluster's GPUs (docs/kubernetes.md); None without it. A name that is no readable
    file stops `make run` at once, with the reason."""
    named = environ.get("GPULOOM_KUBECONFIG")
    if not named:
        return None
    path = Path(named).expanduser().resolve()
    if not path.is_file():
        raise SystemExit(f"GPULOOM_KUBECONFIG={named}: no such file (a kubeconfig)")
    return path


def keep_private(data_dir: Path) -> None:
    """Keep the stack's files from its jobs (docs/operations.md, "Who jobs run as"):
    everything the stack writes from here on is its user's only (umask 077), the data
    dir can be passed through but not listed (0711: a job reaches its run folder
    under `agent/`), and what an earlier start left there loses its other bits."""
    os.umask(0o077)
    data_dir.chmod(0o711)
    for entry in data_dir.iterdir():
        if entry.name != "agent" and not entry.is_symlink():
            entry.chmod(entry.stat().st_mode & 0o700)


#: Signals that stop `make run`: Ctrl-C, `kill`, and the terminal going away.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def shutdown(
    stack: Stack | None, nats: NatsServer | None, answering: tuple[str, str] | None = None
) -> None:
    """Stop the services, then nats-server, first saying how many jobs stay on their
    nodes (`answering`: the gateway to ask, and a token). A second stop signal must not
    abandon the services half-stopped: from here on it only hurries the stop along
    (SIGKILL instead of waiting)."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, _hurry)
    say("\nstopping gpuloom ... (Ctrl-C again to kill at once)")
    if answering is not None and not _hurried:
        say(left_running(*answering))
    try:
        if stack is not None:
            stack.stop(hurry=lambda: _hurried)
    finally:
        if nats is not None:
            nats.kill() if _hurried else nats.stop()
    say("stopped.")


_hurried = False


def left_running(gateway_url: str, token: str) -> str:
    """What the stop leaves behind: the jobs placed or running (their processes on the
    simulated nodes go on; the next start adopts them), as the gateway counts them."""
    counts = []
    for state in ("running", "placed"):
        request = urllib.request.Request(
            f"{gateway_url}/v1/jobs?state={state}&limit=1",
            headers={"Authorization": f"Bearer {token}"},
        )
        try:
            with urllib.request.urlopen(request, timeout=2) as answer:
                counts.append(int(json.load(answer)["total"]))
        except (OSError, ValueError, KeyError):
            return "(could not ask the gateway how many jobs are running)"
    total = sum(counts)
    if total == 0:
        return "no job is running: nothing is left behind."
    jobs = "1 job is" if total == 1 else f"{total} jobs are"
    return (
        f"{jobs} running or starting: their processes keep running, and the next "
        "`make run` adopts them (their ends, logs and charges are kept). To stop them "
        "too, cancel them first (gpuloom cancel ID) and wait for them to end."
    )


def _hurry(signum: int, frame: object) -> None:
    global _hurried
    _hurried = True


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


BANNER = """
gpuloom is running.
  gateway   {url}   (OpenAPI: {url}/docs)
  dashboard {url}/ui/   (log in with the token below)
  NATS      {nats}   (each service its own identity: {data}/bus; admin URL in {data}/stack.json)
  data      {data}   (logs in {data}/logs)
  fsync     {sync}   (GPULOOM_NATS_SYNC: `always` for every event; see docs/operations.md)

In another shell, where the gateway is and an operator token for it (8 hours; more:
gpuloom token issue --user NAME [--role operator] [--ttl 8h]); the CLI reads both:
  export GPULOOM_GATEWAY_URL={url}
  export GPULOOM_TOKEN={token}

Submit a job:
  curl -s -X POST {url}/v1/jobs -H "Authorization: Bearer $GPULOOM_TOKEN" \\
    -H 'content-type: application/json' \\
    -d '{{"name": "hello", "user": "alice", "account": "research", "gpus": 2,
         "command": ["sh", "-c", "echo GPUs: $CUDA_VISIBLE_DEVICES; sleep 5"]}}'
or with the CLI (it sends $GPULOOM_TOKEN):
  .venv/bin/gpuloom submit --user alice --account research --gpus 2 -- sh -c 'nvidia-smi || sleep 5'
  .venv/bin/gpuloom jobs
  .venv/bin/gpuloom watch        (the event stream, live)

Ctrl-C stops the services and says how many jobs it leaves running: they keep running,
and the next `make run` resumes from the same log and adopts them (cancel them first to
stop them too).
"""


if __name__ == "__main__":
    main()

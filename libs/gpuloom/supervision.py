"""The launcher's watch over what it started (`make run`, `gpuloom.devstack`): a service
that dies is started again, and so is the stack's own nats-server, on the same port
and store with the same identities; a process that keeps dying is started again less
and less often (`Restarts`). Everything it says goes to the operator through `say`.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from gpuloom.natsserver import NatsServer, PortTakenError


class Supervised(Protocol):
    """What the watch needs of the processes it restarts (`gpuloom.devstack.Stack`)."""

    log_dir: Path

    def exited(self) -> dict[str, int]:
        """The processes that ended, with their exit codes."""
        ...

    def spawn(self, name: str) -> None:
        """Start process `name` again."""
        ...


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


@dataclass
class Restarts:
    """When to start again a supervised process that died (each service and nats-server
    alike): at once (the next tick) if it had run at least `healthy_s`; else, as it keeps
    dying, after 1, 2, 4 ... s (`first_s` doubling), never more than `max_s`."""

    first_s: float = 1.0
    max_s: float = 30.0
    healthy_s: float = 30.0
    started_at: float = field(default_factory=time.monotonic)
    failures: int = 0
    #: When the restart is due (monotonic); None while the process runs.
    due: float | None = None

    def died(self, now: float) -> float:
        """Note a death (or a failed start) seen at `now`; the delay before the restart."""
        if now - self.started_at >= self.healthy_s:
            self.failures = 0
        delay = 0.0 if self.failures == 0 else self.first_s * 2 ** (self.failures - 1)
        self.failures += 1
        delay = min(delay, self.max_s)
        self.due = now + delay
        return delay

    def is_due(self, now: float) -> bool:
        return self.due is not None and now >= self.due

    def started(self, now: float) -> None:
        self.started_at, self.due = now, None


def ended(code: int) -> str:
    """How a process ended, from its exit code: `exited with 1`, `was killed by SIGKILL`."""
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
    return f"exited with {code}"


def after(delay: float) -> str:
    return "restarting" if delay <= 0 else f"restarting in {delay:.0f} s"


def supervise(stack: Supervised, nats: NatsServer | None = None, tick: float = 1.0) -> None:
    """Restart any service that dies, and `nats` (the stack's own nats-server) if it
    dies, with the same port, store and identities, until a stop signal. A process that
    keeps dying is restarted less and less often (`Restarts`)."""
    restarts: dict[str, Restarts] = {}
    server = Restarts()
    while True:
        time.sleep(tick)
        now = time.monotonic()
        if nats is not None:
            supervise_nats(nats, server, now)
        for name, code in stack.exited().items():
            policy = restarts.setdefault(name, Restarts())
            if policy.due is None:
                delay = policy.died(now)
                log = stack.log_dir / f"{name}.log"
                say(f"service {name} {ended(code)}; {after(delay)} (log: {log})")
            if policy.is_due(now):
                stack.spawn(name)
                policy.started(now)


def supervise_nats(nats: NatsServer, policy: Restarts, now: float) -> None:
    """One look at the stack's nats-server: a death is said once; the restart waits for
    `policy`. The services' connections retry without end, so they resume by themselves."""
    if policy.due is None:
        code = nats.exited()
        if code is None:
            return
        delay = policy.died(now)
        say(
            f"nats-server {ended(code)}; {after(delay)} on port {nats.port} with the same "
            f"store {nats.store_dir} (log: {nats.log_file})"
        )
    if not policy.is_due(now):
        return
    try:
        nats.restart()
    except PortTakenError as exc:
        problem = f"cannot listen: {exc}"
    except (OSError, RuntimeError, TimeoutError) as exc:
        problem = f"did not start: {exc}"
    else:
        policy.started(time.monotonic())
        pid = nats.process.pid if nats.process else "?"
        say(f"nats-server is back on port {nats.port} (pid {pid}); the services reconnect")
        return
    policy.started(now)  # a failed start counts as a quick death
    delay = policy.died(time.monotonic())
    say(f"nats-server {problem}; retrying in {delay:.0f} s (log: {nats.log_file})")

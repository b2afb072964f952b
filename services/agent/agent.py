"""The agent's decision step and its outbox: reconcile, act, report.

`Agent.decide` is the Reactor's decision function: it runs `reconcile` on the
folded state, carries out the actions with the `Runner`, and returns the events
that answer them (JobStarted, or JobFinished for a job that never ran).

Ends noticed by the runner's watcher go to the outbox instead, keyed by
`(job_id, attempt)`, and stay there until published: a publish that fails (NATS
down) is retried, so no end is dropped while the agent lives; if it dies, the
`exit` file is still there for the next agent. An entry is discarded unpublished
only when the log shows its attempt is over on this node, where its event would
be voided anyway.

Each action is carried out on its own: one that raises is logged with its job
and costs only that job (a spawn that can never work is reported failed by the
runner; anything else is tried again next round), never the rest of the round.
While the agent is fenced (see `fence`) it starts nothing and reports nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Protocol

from gpuloom.events import Decision
from gpuloom.state import ClusterState
from services.agent.cgroups import Cgroups
from services.agent.containers import Podman
from services.agent.fence import Fence
from services.agent.gpuwatch import GpuMemoryProbe
from services.agent.health import HealthWatch
from services.agent.identity import Accounts
from services.agent.outcomes import Exited, NotStarted, Started
from services.agent.pacing import StartBudget
from services.agent.reconcile import (
    Action,
    Drop,
    Ensure,
    Forget,
    JobKey,
    Report,
    Status,
    Stop,
    finished,
    is_current,
    reconcile,
    started,
)
from services.agent.rendezvous import Rendezvous
from services.agent.runner import Runner

log = logging.getLogger(__name__)

#: Most events one outbox publish carries.
OUTBOX_BATCH = 500
#: Actions carried out between two yields to the event loop.
YIELD_EVERY = 32
#: Spawns in flight at once: under load each waits for its child to be scheduled.
SPAWN_THREADS = 4


class LogPort(Protocol):
    """What the agent needs of the log: the Reactor has all of it."""

    caught_up: asyncio.Event

    @property
    def state(self) -> ClusterState: ...

    async def publish(self, decisions: Sequence[Decision]) -> int: ...


class Agent:
    """Reconciles the jobs of `nodes` with the processes of a `Runner` on `root`."""

    def __init__(
        self,
        nodes: Sequence[str],
        root: Path,
        *,
        grace_s: float = 5.0,
        poll_s: float = 0.1,
        environ: Mapping[str, str] | None = None,
        probe: GpuMemoryProbe | None = None,
        fence: Fence | None = None,
        accounts: Accounts | None = None,
        rendezvous: Rendezvous | None = None,
        podman: Podman | None = None,
        cgroups: Cgroups | None = None,
        max_log_bytes: int = 0,
        checkpoint_most_s: float = 300.0,
        hide: Sequence[str] = (),
        budget: StartBudget | None = None,
        health: HealthWatch | None = None,
    ) -> None:
        self.nodes = sorted(nodes)
        #: The GPUs' health checks (None: none), looked at most once per its interval.
        self.health = health
        #: How fast each user's jobs start on each node (None: as fast as they come).
        self.budget = budget
        self.runner = Runner(
            root,
            self.on_exit,
            grace_s=grace_s,
            poll_s=poll_s,
            environ=environ,
            probe=probe,
            accounts=accounts,
            rendezvous=rendezvous,
            podman=podman,
            cgroups=cgroups,
            max_log_bytes=max_log_bytes,
            checkpoint_most_s=checkpoint_most_s,
            hide=hide,
        )
        self.outbox: dict[JobKey, Exited] = {}
        self._spawner = ThreadPoolExecutor(SPAWN_THREADS, thread_name_prefix="spawn")
        self.fence = fence
        #: How far the state reaches on every node (None: `state.seq`, a whole fold).
        self.complete: Callable[[], int] | None = None
        self._wake = asyncio.Event()

    # --- the decision step ---------------------------------------------------------

    async def decide(self, state: ClusterState) -> list[Decision]:
        """Reconcile, act, and return the events to publish (Reactor contract).

        The jobs to start are started together, their spawns overlapping in the
        agent's spawn threads (`SPAWN_THREADS`); the state cannot change meanwhile:
        only the Reactor folds, and it is waiting for this round.
        """
        decisions: list[Decision] = []
        fenced = self.fenced(state)
        starts: list[Ensure] = []
        local = self.runner.views()
        now = time.monotonic()
        for done, action in enumerate(reconcile(state, self.nodes, local), 1):
            if fenced and isinstance(action, Ensure | Report):
                continue  # cut off, or not caught up since: the log may say otherwise
            if isinstance(action, Ensure) and self._held_back(action, local, now):
                continue  # its user's starts on this node are over budget: a later round
            if isinstance(action, Ensure) and not _reserves_a_port(action):
                starts.append(action)
                continue
            decisions.extend(await self._contained(state, action))
            if done % YIELD_EVERY == 0:
                # Let heartbeats, log requests and the watcher run during a big round.
                await asyncio.sleep(0)
        for found in await asyncio.gather(*(self._contained(state, a) for a in starts)):
            decisions.extend(found)
        if self.health is not None and not fenced:
            decisions.extend(await self.health.check(now))
        return decisions

    def _held_back(self, action: Ensure, local: Mapping[JobKey, object], now: float) -> bool:
        """A new start (not an adoption) over its user's budget on its node (`pacing`)."""
        if self.budget is None or action.phase != "placed" or action.key in local:
            return False
        return not self.budget.take(action.node, action.spec.user, now)

    async def _contained(self, state: ClusterState, action: Action) -> list[Decision]:
        """`_act`, where one job's failure never costs the round (containment)."""
        try:
            return await self._act(state, action)
        except OSError as exc:  # e.g. disk full: the next round tries again
            log.error("job %s: could not carry out %s: %s", _job_of(action), action, exc)
        except Exception:
            log.exception("job %s: %s failed; tried again next round", _job_of(action), action)
        return []

    async def _spawn(self, call: Callable[[], int]) -> int:
        """Run a spawn in one of the agent's spawn threads (the GIL is released while
        the child is created and scheduled)."""
        return await asyncio.get_running_loop().run_in_executor(self._spawner, call)

    async def _act(self, state: ClusterState, action: Action) -> list[Decision]:
        if isinstance(action, Report):
            return [action.decision]
        if isinstance(action, Ensure):
            job = state.jobs[action.job_id]
            result = await self.runner.ensure_async(action, self._spawn)
            if isinstance(result, Started):
                return [started(job, action.node, result.pid, action.replica, result.master)]
            if isinstance(result, NotStarted):
                end = result.ended
                return [
                    finished(
                        job, action.node, end.outcome, end.exit_code, end.reason, action.replica
                    )
                ]
            return []
        if isinstance(action, Stop):
            self.runner.stop(
                action.key, action.outcome, action.reason, checkpoint=action.checkpoint
            )
        elif isinstance(action, Drop):
            self.runner.drop(action.key)
            self.outbox.pop(action.key, None)
        elif isinstance(action, Forget):
            self.runner.forget(action.key)
            self.outbox.pop(action.key, None)
        return []

    # --- self-fencing --------------------------------------------------------------

    def fenced(self, state: ClusterState) -> bool:
        """The fence is up, and the state does not yet reach the log's end as it was
        when the bus came back (`complete`: how far every node's view reaches)."""
        if self.fence is None:
            return False
        return self.fence.holds(state.seq if self.complete is None else self.complete())

    def fence_jobs(self, cut_off_s: float) -> list[JobKey]:
        """Stop every local job: the agent has been cut off from the bus `cut_off_s`."""
        reason = (
            f"stopped by its agent: cut off from the bus for {cut_off_s:.1f} s "
            "(self-fencing, before its node is declared lost)"
        )
        keys = [
            key
            for key, local in sorted(self.runner.views().items())
            if local.status in (Status.RUNNING, Status.ORPHAN)
        ]
        log.critical(
            "FENCING: no contact with the bus for %.1f s; stopping %d job(s) on %s: %s",
            cut_off_s,
            len(keys),
            ", ".join(self.nodes),
            ", ".join(f"{k[0]}#{k[1]}" for k in keys) or "none",
        )
        grace_s = self.fence.grace_s if self.fence is not None else None
        for key in keys:
            self.runner.stop(key, "failed", reason, grace_s)
        return keys

    # --- the outbox ----------------------------------------------------------------

    def on_exit(self, exited: Exited) -> None:
        """Runner callback: queue the end for publishing."""
        self.outbox[exited.key] = exited
        self._wake.set()

    def due(self, state: ClusterState) -> tuple[list[JobKey], list[Decision]]:
        """The outbox entries ready to publish, and their events, in key order.

        An entry waits while the state has not folded its attempt's placement; it
        is discarded when its attempt is over on its node, and when the state no
        longer knows its job: the runner starts a process only for a placement the
        state has folded, and the outbox publishes only once the agent has caught
        up, so a job the state lacks then has ended and been forgotten (its
        tombstone too, after the retention window). An attempt the log still shows
        as placed gets its JobStarted first, so that the run is recorded (and
        charged) before it ends.
        """
        keys: list[JobKey] = []
        decisions: list[Decision] = []
        if self.fenced(state):
            # After a cut-off, the log may have requeued these attempts (NodeLost):
            # wait until the state has caught up, then their ends are discarded.
            return keys, decisions
        for key in sorted(self.outbox):
            exited = self.outbox[key]
            job = state.jobs.get(key[0])
            if job is None:
                del self.outbox[key]  # ended and forgotten: its end is no longer news
                log.info("agent drops the end of job %s: the log has forgotten it", key[0])
                continue
            if job.attempt < key[1]:
                continue  # the state is behind: wait
            if not is_current(state, key, exited.node):
                del self.outbox[key]
                continue
            replica = key[2]
            if replica not in job.started_replicas and exited.pid is not None:
                decisions.append(started(job, exited.node, exited.pid, replica, exited.master))
            end = exited.ended
            decisions.append(
                finished(job, exited.node, end.outcome, end.exit_code, end.reason, replica, end.at)
            )
            keys.append(key)
            if len(decisions) >= OUTBOX_BATCH:
                break
        return keys, decisions

    async def flush(self, port: LogPort) -> bool:
        """Publish what is due; True if nothing is left to retry."""
        keys, decisions = self.due(port.state)
        if not decisions:
            return True
        try:
            await port.publish(decisions)
        except Exception as exc:  # NATS down or slow: keep the entries, retry
            log.warning("agent could not publish %d events, will retry: %s", len(decisions), exc)
            return False
        for key in keys:
            self.outbox.pop(key, None)
        return not self.outbox

    async def run_outbox(self, port: LogPort, stop: asyncio.Event, retry_s: float = 0.5) -> None:
        """Publish outbox entries as they come, once `port` has caught up with the log."""
        await port.caught_up.wait()
        while not stop.is_set():
            self._wake.clear()
            done = await self.flush(port)
            idle = done and not self.outbox
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), 1.0 if idle else retry_s)


def _job_of(action: Action) -> str:
    """The job an action is about, for the logs."""
    if isinstance(action, Report):
        return str(getattr(action.decision.event, "job_id", "?"))
    if isinstance(action, Ensure):
        return action.job_id
    return action.key[0]


def _reserves_a_port(action: Ensure) -> bool:
    """A gang's replica 0 reserves its rendezvous port from the ports its agent's
    other masters hold: such starts go one at a time, never two reservations at once."""
    return len(action.hosts) > 1 and action.replica == 0

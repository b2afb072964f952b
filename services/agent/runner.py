"""The I/O shell around job processes: start, adopt, watch, stop, kill.

A `Runner` holds the agent's local processes (one shim per `(job_id, attempt)`)
and carries out the actions of `reconcile`. Its `run` loop polls every
`poll_s`: it notices ended shims, enforces time limits and escalates stops
(SIGTERM via the shim, after `grace_s` SIGKILL of the command, after another
`grace_s` SIGKILL of the whole group), with `cgroups` holds each job in a cgroup of
its own that is killed when the job ends (`services.agent.cgroups`), and stops jobs
over their GPU memory or their logs' cap (`services.agent.watches`). Each end is
handed once to `on_exit` as an `Exited`, except the ends of dropped processes, which
are silent. How each
step of a stop is carried out and an end is noticed: `services.agent.processes`.

Everything the runner knows is also in the run folders (see `shim`), so a new
runner on the same root (after a `kill -9` of the agent) finds live shims with
`scan` and picks up their ends from the `exit` files.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpuloom.events import Outcome
from services.agent.cgroups import Cgroups, JobGroup
from services.agent.confinement import (
    LOG_CAP_GRACE_S,
    adopted_group,
    ended_in_group,
    release,
    release_leftover,
)
from services.agent.containers import Podman, Removals, read_name
from services.agent.gpuwatch import GpuMemoryProbe, memory_limits
from services.agent.identity import Accounts, job_accounts, prepare_workdir
from services.agent.jobenv import base_environment, ensure_environment, exec_size_problem
from services.agent.launching import never_started, spawn, start_problem
from services.agent.outcomes import EnsureResult, Exited, NotStarted, Resumed, Started, read_end
from services.agent.processes import (
    LIVENESS_EVERY_S,
    WARNED,
    Proc,
    checkpoint_of,
    escalate_stop,
    has_ended,
    terminate,
    warn,
    warn_then_terminate,
)
from services.agent.reconcile import Ensure, JobKey, Local, Status
from services.agent.rendezvous import Master, Rendezvous, format_master, read_master
from services.agent.shim import Ended, RunDir, parse_run_leaf
from services.agent.starting import forget_launch
from services.agent.uids import UIDS_FILE, UidError
from services.agent.watches import log_overruns, memory_overruns

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Spawn:
    """A shim to spawn for `action` in `run` (`call` spawns it and gives its pid)."""

    action: Ensure
    run: RunDir
    master: Master | None
    call: Callable[[], int]
    group: JobGroup | None = None


class Runner:
    def __init__(
        self,
        root: Path,
        on_exit: Callable[[Exited], None],
        *,
        grace_s: float = 5.0,
        poll_s: float = 0.1,
        environ: Mapping[str, str] | None = None,
        probe: GpuMemoryProbe | None = None,
        accounts: Accounts | None = None,
        rendezvous: Rendezvous | None = None,
        podman: Podman | None = None,
        cgroups: Cgroups | None = None,
        max_log_bytes: int = 0,
        checkpoint_most_s: float = 300.0,
        hide: Sequence[str] = (),
    ) -> None:
        self.root = root.resolve()
        #: Where each job's cgroup is made; None: jobs get none (see `cgroups.detect`).
        self.cgroups = cgroups
        #: The most bytes a job's stdout or stderr may hold; 0: no cap.
        self.max_log_bytes = max_log_bytes
        #: The longest a stop waits after a job's checkpoint signal (its `before_s`, at
        #: most this): a preemption or a failed GPU is not held up for longer.
        self.checkpoint_most_s = checkpoint_most_s
        #: What hides other users' processes from a job (`services.agent.hiding`).
        self.hide = list(hide)
        self._logs_checked = 0.0
        self._leftover: list[JobGroup] = []
        #: How jobs that name an image run here; None: they cannot.
        self.podman = podman
        self._removals = Removals(podman) if podman is not None else None
        #: Where gangs whose replica 0 runs here meet (the node's address, its ports).
        self.rendezvous = rendezvous or Rendezvous("127.0.0.1")
        #: Who jobs run as (default: a uid per user when the agent is root, else itself).
        if accounts is None:
            accounts = job_accounts(uid_file=self.root / UIDS_FILE)
        self.accounts = accounts
        self.probe = probe
        self._memory_checked = 0.0
        self.on_exit = on_exit
        self.grace_s = grace_s
        self.poll_s = poll_s
        self.base_env = base_environment(os.environ if environ is None else environ)
        self._procs: dict[JobKey, Proc] = {}

    # --- what reconcile sees -------------------------------------------------------

    def views(self) -> dict[JobKey, Local]:
        return {key: Local(p.node, p.pid, p.status, p.master) for key, p in self._procs.items()}

    # --- actions -------------------------------------------------------------------

    def scan(self, nodes: Iterable[str]) -> int:
        """Register every live shim in the run folders of `nodes` as an ORPHAN."""
        found = 0
        for node in nodes:
            node_dir = self.root / node
            if not node_dir.is_dir():
                continue
            for job_dir in sorted(node_dir.iterdir()):
                for attempt_dir in sorted(job_dir.iterdir()) if job_dir.is_dir() else ():
                    parsed = parse_run_leaf(attempt_dir.name)
                    if parsed is None:
                        continue
                    key = (job_dir.name, *parsed)
                    run = RunDir(self.root, node, *key)
                    pid = run.read_pid()
                    if key in self._procs or pid is None or run.read_exit() is not None:
                        continue
                    if run.shim_alive(pid):
                        self._procs[key] = Proc(node, run, pid, own=False, status=Status.ORPHAN)
                        found += 1
        return found

    def ensure(self, action: Ensure) -> EnsureResult:
        """Make `action`'s attempt run here (idempotent for a key it already holds).

        Adopts a shim found at start-up or in the run folder, reports the end
        recorded there, or, for a placed attempt without a run folder, starts it.
        A command that can never start (a NUL in argv or env, a missing program,
        an argument too long for `execve`) is `NotStarted`, to be reported failed.
        Raises OSError if a new shim cannot be spawned for a reason that may pass
        (disk full, no memory): the caller tries again next round.
        """
        step = self._prepare(action)
        if not isinstance(step, Spawn):
            return step
        try:
            pid: int | Exception = step.call()
        except Exception as exc:
            pid = exc
        return self._spawned(step, pid)

    async def ensure_async(
        self, action: Ensure, run: Callable[[Callable[[], int]], Awaitable[int]]
    ) -> EnsureResult:
        """`ensure`, with the spawn itself carried out by `run` (in a thread: under load
        a spawn waits 3 to 12 ms for its child to be scheduled, which would hold the
        agent's loop, and spawns of several jobs may then overlap)."""
        step = self._prepare(action)
        if not isinstance(step, Spawn):
            return step
        try:
            pid: int | Exception = await run(step.call)
        except Exception as exc:
            pid = exc
        return self._spawned(step, pid)

    def _prepare(self, action: Ensure) -> EnsureResult | Spawn:
        """Everything `ensure` does before the spawn, and the spawn to make."""
        key = action.key
        run = RunDir(self.root, action.node, *key)
        proc = self._procs.get(key)
        if proc is not None and proc.status is not Status.ORPHAN:
            return Resumed(proc.pid)
        if proc is not None or (run.exists() and run.was_spawned()):
            return self._resume(action, run)
        if action.phase != "placed":
            self._end(key, action.node, run, None, Ended("failed", None, "agent lost the process"))
            return Resumed(None)
        try:
            account = self.accounts.for_user(action.spec.user)
        except UidError as exc:
            return NotStarted(Ended("failed", None, f"could not start: {exc}"))
        master = action.master
        if (len(action.hosts) > 1 or action.spec.elastic) and action.replica == 0:
            held = [p.master[1] for p in self._procs.values() if p.master is not None]
            master = self.rendezvous.reserve(action.job_id, held)  # OSError: next round
        env = ensure_environment(self.base_env, action, account.name, run.work, master)
        env, never = start_problem(action, env, self.podman, self.base_env.get("PATH"), run)
        if never is not None:
            return NotStarted(never)
        run.create(account.gid if os.geteuid() == 0 else None)
        if master is not None and action.replica == 0:
            run.file("master").write_text(format_master(master))
        too_big = exec_size_problem(action.spec.command, env)
        if too_big is not None:
            return self._not_started(run, too_big)
        prepare_workdir(run.work, account)
        podman, hide = self.podman, self.hide
        group = None
        if self.cgroups is not None and action.spec.image is None:
            group = self.cgroups.group(action.node, *key, action.spec)

        def call() -> int:
            return spawn(action, run, account, env, podman, group, hide)

        return Spawn(action, run, master, call, group)

    def _spawned(self, step: Spawn, pid: int | Exception) -> EnsureResult:
        """Take on the shim `step` spawned (its pid), or say why it did not start."""
        action, run, master = step.action, step.run, step.master
        if isinstance(pid, Exception):
            return self._not_started(run, never_started(pid))
        key = action.key
        limit = action.spec.time_limit_s
        self._procs[key] = Proc(
            action.node,
            run,
            pid,
            own=True,
            status=Status.RUNNING,
            time_limit_s=limit,
            deadline=None if limit is None else time.monotonic() + limit,
            memory_limits=memory_limits(action),
            master=master if action.replica == 0 else None,
            container=read_name(run),
            cgroup=step.group,
            checkpoint=checkpoint_of(action.spec),
        )
        return Started(pid, master if action.replica == 0 else None)

    def _not_started(self, run: RunDir, reason: str) -> NotStarted:
        """A spawn that failed for good: record why in the run folder, so that if its
        report is lost the next round (which finds the folder) reports the same."""
        run.write_reason("failed", reason)
        return NotStarted(Ended("failed", None, reason))

    def _resume(self, action: Ensure, run: RunDir) -> Resumed:
        key = action.key
        held = self._procs.get(key)
        pid = held.pid if held is not None else run.read_pid()
        if run.read_exit() is None and pid is not None and run.shim_alive(pid):
            limit = action.spec.time_limit_s
            deadline = None
            if limit is not None:
                since = action.started_at.timestamp() if action.started_at else run.started_wall()
                elapsed = max(0.0, time.time() - since) if since is not None else 0.0
                deadline = time.monotonic() + limit - elapsed
            own = held.own if held is not None else False
            self._procs[key] = Proc(action.node, run, pid, own, Status.RUNNING, limit, deadline)
            self._procs[key].memory_limits = memory_limits(action)
            self._procs[key].master = read_master(run.file("master"))
            self._procs[key].container = read_name(run)
            self._procs[key].cgroup = adopted_group(run, action.spec, self.cgroups)
            self._procs[key].checkpoint = checkpoint_of(action.spec)
            self._procs[key].warned = run.file(WARNED).exists()  # signalled before a restart
            log.info("adopted job %s attempt %d replica %d (shim pid %d)", *key, pid)
            return Resumed(pid)
        name = read_name(run)
        if name is not None and self._removals is not None:
            self._removals.remove(name)
        group = adopted_group(run, action.spec, self.cgroups)
        if group is not None:
            group.kill()
        self._end(key, action.node, run, pid, self._read_end(run, group))
        return Resumed(None)

    def _read_end(self, run: RunDir, group: JobGroup | None) -> Ended:
        """How the run ended (its cgroup's limits told), its cgroup then removed."""
        end = read_end(run)
        if group is None:
            return end
        end = ended_in_group(end, group, run.read_reason() is not None)
        release(group, self._leftover)
        return end

    def stop(
        self,
        key: JobKey,
        outcome: Outcome,
        text: str,
        grace_s: float | None = None,
        *,
        checkpoint: bool = False,
    ) -> None:
        """Record why, then SIGTERM the job's group; the end is reported as `outcome`.
        `grace_s`: wait that long between steps instead of the runner's grace.
        `checkpoint`: the job's checkpoint signal first, if it asked for one (a
        preemption, a failed GPU), and SIGTERM its `before_s` later."""
        proc = self._procs.get(key)
        if proc is None or proc.status not in (Status.RUNNING, Status.ORPHAN):
            return
        proc.run.write_reason(outcome, text)
        proc.status = Status.STOPPING
        proc.grace_s = grace_s
        if checkpoint:
            wait = self.checkpoint_most_s
            warn_then_terminate(proc, proc.grace_s or self.grace_s, self._signal_container, wait)
        else:
            self._terminate(proc)

    def drop(self, key: JobKey) -> None:
        """Kill the job's group; its end is not reported. Forgets an exited process."""
        proc = self._procs.get(key)
        if proc is None or proc.status is Status.DROPPING:
            return
        if proc.status is Status.EXITED:
            del self._procs[key]
            return
        log.info("dropping job %s attempt %d replica %d: no longer on node %s", *key, proc.node)
        if proc.status is not Status.STOPPING:
            self._terminate(proc)
        proc.status = Status.DROPPING

    def forget(self, key: JobKey) -> None:
        proc = self._procs.get(key)
        if proc is not None and proc.status is Status.EXITED:
            del self._procs[key]

    def _terminate(self, proc: Proc) -> None:
        terminate(proc, proc.grace_s or self.grace_s)

    # --- watching ------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Poll until `stop` is set. Processes keep running when it returns."""
        while not stop.is_set():
            self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.poll_s)

    def watch_memory(self, now: float) -> None:
        """Stop jobs over their GPU memory slice (where a probe, i.e. NVML, is present)."""
        if self.probe is None or now - self._memory_checked < LIVENESS_EVERY_S:
            return
        self._memory_checked = now
        for key, reason in memory_overruns(self.probe, self._procs).items():
            log.info("job %s attempt %d replica %d: %s", *key, reason)
            self.stop(key, "failed", reason)

    def watch_logs(self, now: float) -> None:
        """Stop jobs whose stdout or stderr passed the cap (see `confinement`)."""
        if self.max_log_bytes <= 0 or now - self._logs_checked < LIVENESS_EVERY_S:
            return
        self._logs_checked = now
        for key, over in log_overruns(self._procs, self.max_log_bytes).items():
            log.info("job %s attempt %d replica %d: %s", *key, over)
            self.stop(key, "failed", over, grace_s=LOG_CAP_GRACE_S)

    def poll(self) -> None:
        """Notice ended processes, enforce time limits, GPU memory and log caps,
        escalate stops."""
        now = time.monotonic()
        self.watch_memory(now)
        self.watch_logs(now)
        if self._leftover:
            release_leftover(self._leftover)
        if self._removals is not None:
            self._removals.reap()
        for key, proc in list(self._procs.items()):
            if proc.status is Status.EXITED:
                continue
            if has_ended(proc):
                self._remove_container(proc)  # whatever podman's client left running
                end = self._read_end(proc.run, proc.cgroup)
                self._end(key, proc.node, proc.run, proc.pid, end)
            elif proc.deadline is not None and now >= proc.deadline:
                self._escalate(key, proc)
            elif (
                proc.checkpoint is not None
                and proc.status is Status.RUNNING
                and proc.deadline is not None
                and now >= proc.deadline - proc.checkpoint[1]
                and not proc.warned
            ):
                log.info("job %s attempt %d replica %d: its checkpoint signal", *key)
                warn(proc, self._signal_container)

    def _escalate(self, key: JobKey, proc: Proc) -> None:
        if proc.status is Status.RUNNING:
            log.info("job %s attempt %d replica %d exceeded its time limit", *key)
            self.stop(key, "timed_out", f"time limit of {proc.time_limit_s} s exceeded")
        else:
            escalate_stop(proc, proc.grace_s or self.grace_s, self._remove_container)

    def _signal_container(self, proc: Proc, number: int) -> None:
        if proc.container is not None and self._removals is not None:
            self._removals.signal(proc.container, number)

    def _remove_container(self, proc: Proc) -> None:
        if proc.container is not None and self._removals is not None:
            self._removals.remove(proc.container)

    def _end(self, key: JobKey, node: str, run: RunDir, pid: int | None, end: Ended) -> None:
        forget_launch(run)
        held = self._procs.get(key)
        if held is not None and held.status is Status.DROPPING:
            del self._procs[key]
            return
        self._procs[key] = Proc(node, run, pid or 0, own=False, status=Status.EXITED)
        log.info("job %s attempt %d replica %d ended: %s (%s)", *key, end.outcome, end.reason or "")
        self.on_exit(
            Exited(key, node, pid, end, read_master(run.file("master")) if key[2] == 0 else None)
        )

"""Composition root of the node agent.

`python -m services.agent --inventory FILE` serves the simulated nodes of FILE;
`python -m services.agent [--node NAME]` serves this machine's real GPUs.

The agent heartbeats every served node on core NATS, answers log requests, and
runs a Reactor whose decision step reconciles local job processes with the view of
its nodes (`services.agent.view`: the jobs placed on them, not the log).
Stopping the agent (SIGTERM) leaves the jobs running: their shims outlive it and
the next agent on the same run folder adopts them. An agent cut off from the bus
stops them itself (`fence`) before its node is declared lost.

It needs of the bus only its port (`gpuloom.bus.port.Bus`): `run_service` hands it the
NATS adapter, and its unit tests run it on the log kept in memory
(`gpuloom.testing.memlog`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import logging
import os
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path

from gpuloom.bus.messages import Received
from gpuloom.bus.port import Bus, CoreMessages, Unserve
from gpuloom.config import Settings, load_settings
from gpuloom.events import NodeSpec
from gpuloom.events.heartbeats import Heartbeat
from gpuloom.events.subjects import agent_logs_subject, heartbeat_subject
from gpuloom.runtime.reactor import Reactor
from gpuloom.runtime.service import run_service
from gpuloom.tasks import cancel_and_wait
from gpuloom.telemetry.logging import setup_logging
from services.agent import fence, logs
from services.agent.agent import Agent
from services.agent.cgroups import UNCONFINED, Cgroups, detect, enable_node
from services.agent.containers import ContainerError, Podman, find_podman
from services.agent.discovery import DiscoveryError, discover_local_node
from services.agent.gpuwatch import nvml_probe
from services.agent.health import HealthProbe, HealthWatch, InjectedFaults, nvml_health
from services.agent.hiding import process_hiding
from services.agent.identity import AccountError, Accounts, job_accounts
from services.agent.inventory_file import InventoryError, ServedNode, load_inventory
from services.agent.pacing import StartBudget
from services.agent.rendezvous import Rendezvous, node_address, parse_ports
from services.agent.uids import UIDS_FILE, UidError, parse_uid_range
from services.agent.view import ViewFollower

log = logging.getLogger("services.agent")

#: Whether a round trip through the bus completes within the given seconds.
Probe = Callable[[float], Awaitable[bool]]


async def heartbeat(
    bus: CoreMessages, nodes: Sequence[ServedNode], interval_s: float, stop: asyncio.Event
) -> None:
    """Publish each node's heartbeat now, then every `interval_s` until `stop`."""
    beats = [
        (heartbeat_subject(n.name), Heartbeat(node=n.name, spec=n.spec).encode()) for n in nodes
    ]
    while not stop.is_set():
        try:
            for subject, body in beats:
                await bus.send(subject, body)
        except Exception as exc:  # NATS reconnecting: the next beat tries again
            log.warning("heartbeat not sent: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


async def serve_logs(bus: CoreMessages, root: Path, node: str) -> Unserve:
    """Answer log requests for `node`; returns what stops it."""

    async def on_request(msg: Received) -> None:
        if msg.respond is not None:
            await msg.respond(logs.answer(root, node, msg.data, bus.max_payload))

    return await bus.serve(agent_logs_subject(node), on_request)


async def bus_probe(bus: CoreMessages) -> tuple[Probe, Unserve]:
    """A probe of the bus: a request through the server that this agent answers itself.

    A partition that leaves the TCP connection open fails it too. (Not `flush()`:
    nats-py leaves a timed-out PING's future queued, and the late PONG then stops
    the client's read loop.)
    """
    subject = bus.new_inbox()

    async def answer(msg: Received) -> None:
        if msg.respond is not None:
            await msg.respond(b"")

    async def reach(timeout_s: float) -> bool:
        if not bus.connected:
            return False
        try:
            await bus.request(subject, b"", timeout_s)
        except Exception:
            return False
        return True

    return reach, await bus.serve(subject, answer)


def make_fence(settings: Settings) -> tuple[fence.Fence | None, float]:
    """The agent's fence and how often to probe the bus; (None, 0) when fencing is off."""
    after_s = settings.fence_after_s()
    if after_s <= 0:
        log.warning("self-fencing is off: jobs of a node cut off from the bus may run twice")
        return None, 0.0
    lost_s = settings.node_lost_timeout_s
    interval, grace_s = fence.plan(after_s, lost_s, settings.cancel_grace_s)
    log.info("self-fencing after %.1f s without the bus (grace %.1f s)", after_s, grace_s)
    return fence.Fence(after_s, time.monotonic(), grace_s), interval


async def fencing(
    bus: Bus, agent: Agent, view: ViewFollower, stop: asyncio.Event, interval_s: float
) -> tuple[list[asyncio.Task[None]], list[Unserve]]:
    """The task that fences `agent` when it is cut off (none when fencing is off). The
    fence lifts once the view of every node reaches the log's end when the bus is back."""
    if agent.fence is None:
        return [], []
    probe, subscription = await bus_probe(bus)

    async def resume_seq() -> int:
        seq = await bus.last_seq()
        view.sync_to(seq)
        return seq

    watcher = fence.watch(agent.fence, probe, resume_seq, agent.fence_jobs, stop, interval_s)
    return [asyncio.create_task(watcher)], [subscription]


async def serve(
    settings: Settings,
    bus: Bus,
    stop: asyncio.Event,
    nodes: Sequence[ServedNode],
    accounts: Accounts | None = None,
    podman: Podman | None = None,
) -> None:
    """The agent's whole life for `nodes`, until `stop`."""
    names = [n.name for n in nodes]
    root = settings.run_dir()
    root.mkdir(parents=True, exist_ok=True)
    if os.geteuid() == 0:  # jobs pass through to their own folder; none lists the others
        root.chmod(0o711)
    simulated = all(node.spec.simulated for node in nodes)
    probe = None if simulated else nvml_probe()
    guard, probe_every_s = make_fence(settings)
    if accounts is None:
        accounts = settings_accounts(settings)
    log.info("%s", accounts.describe())
    cgroups = job_cgroups(settings, names)
    hide, hiding = process_hiding(settings.agent_hide_processes)
    log.info("%s", hiding)
    rendezvous = Rendezvous(
        settings.agent_address or node_address(), parse_ports(settings.agent_rendezvous_ports)
    )
    agent = Agent(
        names,
        root,
        grace_s=settings.cancel_grace_s,
        probe=probe,
        fence=guard,
        accounts=accounts,
        rendezvous=rendezvous,
        podman=podman,
        cgroups=cgroups,
        max_log_bytes=settings.agent_max_log_bytes,
        checkpoint_most_s=settings.agent_checkpoint_most_s,
        hide=hide,
        budget=StartBudget(settings.agent_start_rate, settings.agent_start_burst),
        health=health_watch(settings, nodes),
    )
    runner = agent.runner
    orphans = runner.scan(names)
    for node in nodes:
        log.info(
            "serving node %s: %d GPU(s)%s",
            node.name,
            len(node.spec.gpus),
            " (simulated)" if node.spec.simulated else "",
        )
    log.info("run folders in %s; %d running job(s) found", runner.root, orphans)
    if agent.budget is not None and agent.budget.enabled:
        log.info(
            "each node starts at most %g jobs a second per user (bursts of %g)",
            agent.budget.rate,
            agent.budget.burst,
        )
    if podman is not None:
        log.info("jobs that name an image run with %s (pull %s)", podman.path, podman.pull)
    log.info(
        "gangs whose replica 0 runs here meet at %s, ports %d-%d",
        rendezvous.address,
        rendezvous.ports.start,
        rendezvous.ports.stop - 1,
    )
    view = ViewFollower(bus, names)
    agent.complete = view.complete_seq
    reactor = Reactor(bus, "agent", agent.decide, tick_s=0.5, follower=view)
    subscriptions = [await serve_logs(bus, runner.root, name) for name in names]
    fence_tasks, fence_subscriptions = await fencing(bus, agent, view, stop, probe_every_s)
    subscriptions += fence_subscriptions
    tasks = [
        asyncio.create_task(heartbeat(bus, nodes, settings.heartbeat_interval_s, stop)),
        asyncio.create_task(runner.run(stop)),
        asyncio.create_task(agent.run_outbox(reactor, stop)),
        *fence_tasks,
    ]
    try:
        await reactor.run(stop)
    finally:
        stop.set()
        await cancel_and_wait(*tasks)
        for sub in subscriptions:
            with contextlib.suppress(Exception):
                await sub()


def health_watch(settings: Settings, nodes: Sequence[ServedNode]) -> HealthWatch | None:
    """The GPUs' health checks of `nodes` (`services.agent.health`): the injected faults'
    file for simulated nodes, NVML for real ones; None when off or without NVML."""
    interval = settings.agent_health_interval_s
    served = [(node.name, node.spec) for node in nodes]
    if interval <= 0 or not any(node.spec.gpus for node in nodes):
        return None
    probe: HealthProbe | None
    if all(node.spec.simulated for node in nodes):
        path = settings.agent_faults_file or settings.run_dir() / "faults.yaml"
        probe = InjectedFaults(path, served)
        log.info("GPU health: faults injected in %s, read every %g s", path, interval)
    else:
        probe = nvml_health(settings.agent_health_xids, settings.agent_health_ecc_errors)
        if probe is not None:
            log.info("GPU health: NVML (Xid, ECC, retired pages, lost GPUs) every %g s", interval)
    return HealthWatch(probe, served, interval) if probe is not None else None


def settings_accounts(settings: Settings) -> Accounts:
    """Who jobs run as (`identity.job_accounts`), from `settings`. Raises AccountError
    or UidError when a root agent cannot run jobs as configured."""
    return job_accounts(
        settings.agent_job_user,
        settings.agent_map_users,
        settings.run_dir().resolve() / UIDS_FILE,
        parse_uid_range(settings.agent_job_uid_range),
    )


def job_cgroups(settings: Settings, nodes: Sequence[str]) -> Cgroups | None:
    """The per-job cgroups of this host, or None; says at start what is enforced."""
    cap = settings.agent_max_log_bytes
    log.info("log cap: %s", f"{cap} bytes per stream per job" if cap else "none")
    if settings.agent_cgroups == "off":
        log.warning("per-job cgroups are off (agent_cgroups=off): %s", UNCONFINED)
        return None
    cgroups, why = detect(settings.agent_max_pids)
    if cgroups is None:
        log.warning("no per-job cgroups (%s): %s", why, UNCONFINED)
        return None
    for node in nodes:
        enable_node(cgroups, node)
    log.info("per-job cgroups: %s", why)
    return cgroups


def with_runtimes(nodes: Sequence[ServedNode], runtimes: list[str]) -> list[ServedNode]:
    """`nodes` as they advertise the container runtimes this agent found."""
    return [
        ServedNode(n.name, NodeSpec(**{**n.spec.model_dump(), "runtimes": runtimes})) for n in nodes
    ]


def entrypoint(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m services.agent", description=__doc__.splitlines()[0]
    )
    source = parser.add_mutually_exclusive_group()
    source.add_argument(
        "--inventory",
        type=Path,
        metavar="FILE",
        help="serve the simulated nodes declared in FILE (YAML)",
    )
    source.add_argument(
        "--node", metavar="NAME", help="name of this machine's node (default: its hostname)"
    )
    parser.add_argument(
        "--allow-no-gpu",
        action="store_true",
        help="serve this machine even if it has no GPU (default: refuse to start)",
    )
    args = parser.parse_args(argv)
    settings = load_settings()
    allow_no_gpu = args.allow_no_gpu or settings.agent_allow_no_gpu
    try:
        nodes = (
            load_inventory(args.inventory)
            if args.inventory
            else [
                discover_local_node(
                    args.node, allow_no_gpu=allow_no_gpu, topology=settings.agent_topology
                )
            ]
        )
        if not args.inventory and nvml_probe() is not None:
            # NVML answers: the memory watch enforces every slice's GPU memory
            nodes = [
                ServedNode(n.name, NodeSpec(**{**n.spec.model_dump(), "isolation": "enforced"}))
                for n in nodes
            ]
    except (InventoryError, DiscoveryError) as exc:
        print(f"agent: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    configured = load_settings()
    setup_logging("agent", configured.log_level)  # what the checks below find is logged
    try:  # checked before connecting: jobs never run as root, nor as nobody known
        accounts = settings_accounts(configured)
    except AccountError as exc:
        print(f"agent: GPULOOM_AGENT_JOB_USER: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    except UidError as exc:
        print(f"agent: GPULOOM_AGENT_JOB_UID_RANGE: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    try:
        podman = find_podman(
            configured.agent_containers,
            configured.agent_image_pull,
            real_gpus=any(not n.spec.simulated and n.spec.gpus for n in nodes),
            run_dir=configured.run_dir().resolve(),
        )
    except ContainerError as exc:
        print(f"agent: GPULOOM_AGENT_CONTAINERS=podman: {exc}", file=sys.stderr)
        raise SystemExit(2) from exc
    if podman is not None:
        podman = dataclasses.replace(podman, max_pids=configured.agent_max_pids)
    nodes = with_runtimes(nodes, ["podman"] if podman is not None else [])

    async def main(settings: Settings, bus: Bus, stop: asyncio.Event) -> None:
        await serve(settings, bus, stop, nodes, accounts, podman)

    run_service("agent", main)


if __name__ == "__main__":
    entrypoint()

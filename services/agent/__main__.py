"""Composition root of the node agent.

`python -m services.agent --inventory FILE` serves the simulated nodes of FILE;
`python -m services.agent [--node NAME]` serves this machine's real GPUs.

The agent heartbeats every served node on core NATS, answers log requests, and
runs a Reactor whose decision step reconciles local job processes with the log.
Stopping the agent (SIGTERM) leaves the jobs running: their shims outlive it and
the next agent on the same run folder adopts them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from nats.aio.msg import Msg
from nats.aio.subscription import Subscription

from gpuloom.bus import EventBus
from gpuloom.config import Settings
from gpuloom.events import NodeSpec
from gpuloom.events.heartbeats import Heartbeat
from gpuloom.events.subjects import agent_logs_subject, heartbeat_subject
from gpuloom.runtime.reactor import Reactor
from gpuloom.runtime.service import run_service
from services.agent import logs
from services.agent.agent import Agent
from services.agent.discovery import DiscoveryError, discover_local_node
from services.agent.gpuwatch import nvml_probe
from services.agent.inventory_file import InventoryError, ServedNode, load_inventory

log = logging.getLogger("services.agent")


async def heartbeat(
    bus: EventBus, nodes: Sequence[ServedNode], interval_s: float, stop: asyncio.Event
) -> None:
    """Publish each node's heartbeat now, then every `interval_s` until `stop`."""
    beats = [
        (heartbeat_subject(n.name), Heartbeat(node=n.name, spec=n.spec).encode()) for n in nodes
    ]
    while not stop.is_set():
        try:
            for subject, body in beats:
                await bus.nc.publish(subject, body)
        except Exception as exc:  # NATS reconnecting: the next beat tries again
            log.warning("heartbeat not sent: %s", exc)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), interval_s)


async def serve_logs(bus: EventBus, root: Path, node: str) -> Subscription:
    """Answer log requests for `node`; returns the subscription."""

    async def on_request(msg: Msg) -> None:
        await msg.respond(logs.answer(root, node, msg.data, bus.nc.max_payload))

    return await bus.nc.subscribe(agent_logs_subject(node), cb=on_request)


async def serve(
    settings: Settings, bus: EventBus, stop: asyncio.Event, nodes: Sequence[ServedNode]
) -> None:
    """The agent's whole life for `nodes`, until `stop`."""
    names = [n.name for n in nodes]
    root = settings.run_dir()
    root.mkdir(parents=True, exist_ok=True)
    simulated = all(node.spec.simulated for node in nodes)
    probe = None if simulated else nvml_probe()
    agent = Agent(names, root, grace_s=settings.cancel_grace_s, probe=probe)
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
    reactor = Reactor(bus, "agent", agent.decide, tick_s=0.5)
    subscriptions = [await serve_logs(bus, runner.root, name) for name in names]
    tasks = [
        asyncio.create_task(heartbeat(bus, nodes, settings.heartbeat_interval_s, stop)),
        asyncio.create_task(runner.run(stop)),
        asyncio.create_task(agent.run_outbox(reactor, stop)),
    ]
    try:
        await reactor.run(stop)
    finally:
        stop.set()
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sub in subscriptions:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()


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
    args = parser.parse_args(argv)
    try:
        nodes = (
            load_inventory(args.inventory) if args.inventory else [discover_local_node(args.node)]
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

    async def main(settings: Settings, bus: EventBus, stop: asyncio.Event) -> None:
        await serve(settings, bus, stop, nodes)

    run_service("agent", main)


if __name__ == "__main__":
    entrypoint()

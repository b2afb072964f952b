"""What the agent says on core NATS, on the log kept in memory: each node's heartbeat,
answers to log requests that fit the server's largest message, and the probe that
tells a bus cut off (`services.agent.__main__`)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import orjson
import pytest

from gpuloom.bus.errors import BusError
from gpuloom.bus.messages import Received
from gpuloom.events.heartbeats import Heartbeat
from gpuloom.events.subjects import agent_logs_subject, heartbeat_subject
from gpuloom.testing.builders import make_node_spec
from gpuloom.testing.memlog import MemoryLog, MemoryServer
from services.agent.__main__ import bus_probe, heartbeat, serve_logs
from services.agent.inventory_file import ServedNode
from services.agent.shim import RunDir


async def test_every_served_node_beats_until_stopped(log: MemoryLog) -> None:
    nodes = [ServedNode(name, make_node_spec(name, 1)) for name in ("node-a", "node-b")]
    beats: list[Heartbeat] = []

    async def on_beat(message: Received) -> None:
        beats.append(Heartbeat.received(message.subject, message.data))

    unserve = await log.serve(heartbeat_subject("*"), on_beat)
    stop = asyncio.Event()
    beating = asyncio.create_task(heartbeat(log, nodes, 0.02, stop))
    while len(beats) < 4:
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(beating, 1)
    await unserve()

    assert [b.node for b in beats[:4]] == ["node-a", "node-b", "node-a", "node-b"]
    assert beats[0].spec == nodes[0].spec


async def test_a_log_request_is_answered_within_the_largest_message(tmp_path: Path) -> None:
    log = MemoryLog(server=MemoryServer(max_payload=4096))
    run = RunDir(tmp_path, "node-a", "j1", 1)
    run.create()
    run.file("stdout").write_text("x" * 10_000 + "the end\n")
    unserve = await serve_logs(log, tmp_path, "node-a")
    try:
        raw = await log.request(
            agent_logs_subject("node-a"), orjson.dumps({"job_id": "j1"}), timeout=1.0
        )
    finally:
        await unserve()

    reply = orjson.loads(raw)
    assert len(raw) <= 4096 and (reply["found"], reply["attempt"]) == (True, 1)
    assert reply["stdout"].endswith("the end\n") and len(reply["stdout"]) < 4096
    with pytest.raises(BusError, match="no responders"):  # nobody serves it any more
        await log.request(agent_logs_subject("node-a"), b"{}", timeout=1.0)


async def test_the_probe_fails_while_the_bus_is_cut_off(log: MemoryLog) -> None:
    reach, unserve = await bus_probe(log)
    try:
        assert await reach(1.0)
        log.connected = False
        assert not await reach(0.1)
        with pytest.raises(ConnectionError):
            await log.send("anything", b"")
        log.connected = True
        assert await reach(1.0)
    finally:
        await unserve()

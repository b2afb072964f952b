"""Only the admin creates streams: `gpuloom bus setup` makes the log and every snapshot
bucket, no process may make one (with a configuration of its choosing), and a service
copes with what the setup did not make."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import nats
import pytest
from nats.js.api import RePublish, StreamConfig
from nats.js.errors import NotFoundError
from test_bus_permissions import STREAM, body, connect_as, server_of

from gpuloom.bus import EventBus
from gpuloom.bus.identities import SERVICES
from gpuloom.bus.jsapi import BASE_BUCKET, bucket_of
from gpuloom.devstack import REPO_ROOT, Stack
from gpuloom.events import JobSubmitted, subject_for
from gpuloom.testing.builders import make_job_spec

pytestmark = pytest.mark.integration


async def stream_names(url: str) -> set[str]:
    nc = await nats.connect(url)
    try:
        return {info.config.name for info in await nc.jetstream().streams_info()}
    finally:
        await nc.close()


async def try_create_as(url: str, identity: str, config: StreamConfig) -> str:
    errors: list[str] = []
    nc = await connect_as(url, identity, errors)
    try:
        await nc.jetstream(timeout=1.0).add_stream(config)
        return "created"
    except TimeoutError:
        await asyncio.sleep(0.1)
        return "timeout: " + "; ".join(errors)
    finally:
        await nc.close()


def test_no_process_creates_a_stream_not_even_its_own_bucket(nats_url: str) -> None:
    """The attack a create right would allow: the placement's bucket made with a
    republish onto the event subjects, turning its object writes into forged events."""
    bucket = bucket_of("placement")
    forging = StreamConfig(
        name=f"OBJ_{bucket}",
        subjects=[f"$O.{bucket}.>"],
        republish=RePublish(src=">", dest="gpuloom.evt.job.x.JobPlaced"),
    )
    for identity in ("placement", "gateway", "agent-late", "reader"):
        if identity == "agent-late":
            server_of(nats_url).grant_agent("agent-late", ["node-late"])
        outcome = asyncio.run(try_create_as(nats_url, identity, forging))
        assert "permissions violation" in outcome.lower(), (identity, outcome)
        log = StreamConfig(name=STREAM, subjects=["gpuloom.evt.>"])
        outcome = asyncio.run(try_create_as(nats_url, identity, log))
        assert "permissions violation" in outcome.lower(), (identity, outcome)
    assert not asyncio.run(stream_names(nats_url))


def test_bus_setup_creates_the_log_and_every_bucket_once(nats_url: str, tmp_path: Path) -> None:
    server = server_of(nats_url)
    assert server.keyring is not None
    server.keyring.add_agent("agent-x", ["node-x", "node-y"])
    done = subprocess_setup(nats_url, server.keyring.root)
    assert done.returncode == 0, done.stderr
    # agents keep no snapshots: their state is their nodes' view
    wanted = {STREAM, f"{STREAM}_DLQ", f"{STREAM}_VIEW", f"OBJ_{BASE_BUCKET}"}
    wanted |= {f"OBJ_{bucket_of(s)}" for s in SERVICES}
    assert asyncio.run(stream_names(nats_url)) == wanted
    assert "created now: none" not in done.stdout

    async def cap_the_log() -> int:
        bus = await EventBus.connect(nats_url, STREAM, name="operator", create=False)
        try:
            config = (await bus.js.stream_info(STREAM)).config
            config.max_msgs = 12345
            await bus.js.update_stream(config)
            return int((await bus.js.stream_info(STREAM)).config.max_msgs or 0)
        finally:
            await bus.close()

    assert asyncio.run(cap_the_log()) == 12345
    again = subprocess_setup(nats_url, server.keyring.root)
    assert again.returncode == 0, again.stderr
    assert "created now: none" in again.stdout
    assert asyncio.run(cap_the_log()) == 12345  # the operator's limit survives a setup


def subprocess_setup(url: str, keyring: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": f"{REPO_ROOT / 'libs'}:{REPO_ROOT}"}
    env.pop("GPULOOM_NATS_SEED_FILE", None)
    command = [sys.executable, "-m", "gpuloom.client.buscmds", "setup", "--nats", url]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)


def wait_line(path: Path, text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text(errors="replace")):
        assert time.monotonic() < deadline, f"{path.name} never said {text!r}"
        time.sleep(0.2)


def test_a_service_waits_for_the_log_and_runs_without_a_missing_bucket(
    nats_url: str, tmp_path: Path
) -> None:
    database = f"sqlite+aiosqlite:///{tmp_path}/gpuloom.db"
    env = {"GPULOOM_SNAPSHOT_EVERY_EVENTS": "1", "GPULOOM_SNAPSHOT_EVERY_S": "0.2"}
    stack = Stack.for_urls(nats_url, database, tmp_path, env)
    stack.provisioned = True  # as if set up: the service starts before the log exists
    try:
        stack.start("queue")
        log = tmp_path / "logs" / "queue.log"
        wait_line(log, "gpuloom bus setup")
        assert not asyncio.run(stream_names(nats_url))  # it waits; it creates nothing
        stack.provisioned = False
        stack.provision()

        async def drop_bucket_then_log() -> None:
            nc = await nats.connect(nats_url)
            try:
                await nc.jetstream().delete_object_store(bucket_of("queue"))
                submitted = JobSubmitted(job_id="j1", spec=make_job_spec(gpus=1))
                await nc.jetstream().publish(subject_for(submitted), body(submitted))
            finally:
                await nc.close()

        asyncio.run(drop_bucket_then_log())
        wait_line(log, "takes no snapshots: its bucket GPULOOM_SNAP_QUEUE does not exist")
        with pytest.raises(NotFoundError):
            asyncio.run(_info(nats_url, f"OBJ_{bucket_of('queue')}"))
        assert stack.exited() == {}
    finally:
        stack.stop()


async def _info(url: str, stream: str) -> object:
    nc = await nats.connect(url)
    try:
        return await nc.jetstream().stream_info(stream)
    finally:
        await nc.close()

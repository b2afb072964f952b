"""The snapshot store against the real nats-server: each service writes, lists and reads
back its own bucket, keeps the newest two, and cannot touch another service's."""

from __future__ import annotations

import asyncio
import hashlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from nats.js.errors import NotFoundError
from test_bus_permissions import connect_as, server_of

from gpuloom.bus.provision import provision_at
from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.natsserver import strip_credentials

pytestmark = pytest.mark.integration


@pytest.fixture
async def nats_url(nats_url: str) -> str:
    """The test NATS, set up by the admin (the buckets no service may create)."""
    await provision_at(nats_url, "GPULOOM")
    return nats_url


async def store_as(
    url: str, identity: str, service: str, errors: list[str]
) -> tuple[Any, SnapshotStore]:
    nc = await connect_as(url, identity, errors)
    return nc, SnapshotStore(nc.jetstream(timeout=2.0), service, keep=2)


async def test_a_service_keeps_its_newest_snapshots_in_its_own_bucket(nats_url: str) -> None:
    errors: list[str] = []
    nc, store = await store_as(nats_url, "placement", "placement", errors)
    try:
        assert await store.stored() == []
        for seq in (10, 250, 40):
            await store.write(seq, f"state at {seq}".encode() * 50_000)  # chunked: 650 kB
        kept = await store.stored()
        # newest first; the one just written (40) and those past it (250: another copy's,
        # or an earlier log's) stay; of the older ones, keep - 1 (10)
        assert [s.seq for s in kept] == [250, 40, 10]
        assert await store.read(kept[0]) == b"state at 250" * 50_000
        assert await store.read(kept[1]) == b"state at 40" * 50_000
        await store.write(300, b"state at 300")
        assert [s.seq for s in await store.stored()] == [300, 250]
    finally:
        await nc.close()
    assert not errors, errors


async def test_a_service_cannot_write_another_services_snapshots(nats_url: str) -> None:
    errors: list[str] = []
    nc, own = await store_as(nats_url, "admission", "admission", errors)
    await own.write(5, b"admission's own state")
    await nc.close()

    errors.clear()
    nc, forged = await store_as(nats_url, "queue", "admission", errors)
    try:
        with pytest.raises(Exception):  # noqa: B017 (refused: a timeout or a JetStream error)
            await asyncio.wait_for(forged.write(99, b"a forged state"), 10)
    finally:
        await nc.close()
    assert any("permissions violation" in e.lower() for e in errors), errors

    nc, own = await store_as(nats_url, "admission", "admission", [])
    try:
        assert [s.seq for s in await own.stored()] == [5]
        assert await own.read((await own.stored())[0]) == b"admission's own state"
    finally:
        await nc.close()


WRITER = """
import asyncio, hashlib, os, sys
from pathlib import Path
import nats
from gpuloom.bus.credentials import seed_options
from gpuloom.bus.snapshots import SnapshotStore

async def main(url, seed):
    nc = await nats.connect(url, **seed_options(Path(seed)))
    store = SnapshotStore(nc.jetstream(timeout=5.0), "placement", keep=2)
    seq = 100
    while True:
        body = os.urandom(3_000_000)
        await store.write(seq, hashlib.sha256(body).digest() + body)
        print("wrote", seq, flush=True)
        seq += 1

asyncio.run(main(sys.argv[1], sys.argv[2]))
"""


async def test_a_writer_killed_mid_snapshot_leaves_only_whole_ones(
    nats_url: str, tmp_path: Path
) -> None:
    """kill -9 of a process while it writes: every snapshot listed reads back whole, and
    the chunks of the upload it cut are swept once they are old enough."""
    keyring = server_of(nats_url).keyring
    assert keyring is not None
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    url, seed = strip_credentials(nats_url), str(keyring.seed_file("placement"))
    whole = 0
    cut: list[str] = []
    # A kill lands mid-upload or between two; try more moments until one cut an upload
    # (the writer's start-up time varies with the machine's load).
    for attempt, delay in enumerate((0.9, 1.2, 1.5, 1.9, 1.35, 1.65, 2.2, 2.6, 1.05, 1.75)):
        if attempt >= 4 and cut and whole:
            break
        writer = subprocess.Popen([sys.executable, str(script), url, seed], stdout=subprocess.PIPE)
        await asyncio.sleep(delay)
        writer.send_signal(signal.SIGKILL)
        writer.wait(10)
        nc, store = await store_as(nats_url, "placement", "placement", [])
        try:
            for snapshot in await store.stored():
                data = await store.read(snapshot)
                assert len(data) == snapshot.size == 32 + 3_000_000, snapshot
                assert hashlib.sha256(data[32:]).digest() == data[:32], snapshot
                whole += 1
            assert await store.sweep() == []  # cut just now: maybe an upload under way
            cut += await store.sweep(older_than_s=0)
            assert await unnamed_chunks(store) == set()
        finally:
            await nc.close()
    assert whole > 0, "the writer never finished a snapshot: nothing was checked"
    assert cut, "no kill cut an upload: the sweep was not tried"


async def unnamed_chunks(store: SnapshotStore) -> set[str]:
    """The chunk ids in the bucket that no object names."""
    try:
        named = {i.nuid for i in await (await store._open()).list(ignore_deletes=True)}
    except NotFoundError:  # what nats-py says of a bucket with no object
        named = set()
    prefix = f"$O.{store.bucket}.C."
    info = await store.js.stream_info(f"OBJ_{store.bucket}", subjects_filter=f"{prefix}>")
    return {s.removeprefix(prefix) for s in info.state.subjects or {}} - named

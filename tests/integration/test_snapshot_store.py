"""The snapshot store against the real nats-server: each service writes, lists and reads
back its own bucket, keeps the newest two, and cannot touch another service's."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from test_bus_permissions import connect_as

from gpuloom.bus.snapshots import SnapshotStore

pytestmark = pytest.mark.integration


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
        assert [s.seq for s in kept] == [250, 40]  # newest first; 10 dropped
        assert await store.read(kept[0]) == b"state at 250" * 50_000
        assert await store.read(kept[1]) == b"state at 40" * 50_000
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

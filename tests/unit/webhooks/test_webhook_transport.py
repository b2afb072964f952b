"""One delivery attempt against hostile receivers on loopback: an endless answer costs
a few KiB and ends at once, a receiver that drips ends at the attempt's deadline, and
one owner's webhooks cannot take every slot."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager

import httpx
import pytest

from gpuloom.webhooks import transport
from gpuloom.webhooks.policy import RESPONSE_KEPT, Address
from gpuloom.webhooks.transport import READ_MAX, Answer, send
from services.webhooks.lanes import Lanes

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


@asynccontextmanager
async def receiver(handler: Handler) -> AsyncIterator[str]:
    """A TCP server on 127.0.0.1 running `handler` for each connection; its URL."""

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            await handler(reader, writer)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}/hook?token=s3cret"
    finally:
        server.close()


async def attempt(url: str, timeout_s: float) -> tuple[float, Answer]:
    async with httpx.AsyncClient(trust_env=False) as client:
        started = time.monotonic()
        answer = await send(client, url, b"{}", {}, allow_private=True, timeout_s=timeout_s)
        return time.monotonic() - started, answer


async def test_an_endless_answer_is_read_only_a_few_kib_and_ends_at_once() -> None:
    sent = 0
    chunk = b"x" * 65536

    async def endless(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal sent
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 536870912\r\n\r\n")  # 512 MiB
        while sent < 512 * 1024 * 1024:
            writer.write(chunk)
            await writer.drain()
            sent += len(chunk)

    async with receiver(endless) as url:
        took, answer = await attempt(url, timeout_s=5.0)
    assert answer.status_code == 200 and answer.error is None
    assert len(answer.response) == RESPONSE_KEPT
    assert took < 2.0  # not read to the end, nor to the deadline
    assert sent < 32 * 1024 * 1024  # what the sockets' buffers took, not 512 MiB
    assert READ_MAX <= 8192


@pytest.mark.parametrize("when", ["before the status line", "in the body"])
async def test_a_receiver_that_drips_is_cut_at_the_deadline(when: str) -> None:
    async def drip(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if when == "in the body":
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
        for _ in range(1000):  # a byte every 0.1 s: every read succeeds in time
            writer.write(b"H" if when != "in the body" else b"x")
            await writer.drain()
            await asyncio.sleep(0.1)

    async with receiver(drip) as url:
        took, answer = await attempt(url, timeout_s=0.6)
    assert answer.status_code is None
    assert "within 0.6 s" in answer.error
    assert 0.5 < took < 1.5


async def test_errors_do_not_carry_the_url() -> None:
    async def hang_up(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.transport.abort()

    async with receiver(hang_up) as url:
        _, answer = await attempt(url, timeout_s=2.0)
    assert answer.status_code is None and answer.error
    assert "s3cret" not in answer.error and "/hook" not in answer.error


async def test_one_owner_holds_at_most_its_slots_and_others_still_get_one() -> None:
    lanes = Lanes(total=3, per_owner=2)
    held = asyncio.Event()
    release = asyncio.Event()
    inside: list[str] = []

    async def hold(owner: str) -> None:
        async with lanes.slot(owner):
            inside.append(owner)
            held.set()
            await release.wait()

    alices = [asyncio.create_task(hold("alice")) for _ in range(5)]
    await held.wait()
    await asyncio.sleep(0.05)
    assert inside.count("alice") == 2  # her other three wait for her own slots
    bob = asyncio.create_task(hold("bob"))
    await asyncio.wait_for(_until(lambda: "bob" in inside), 1.0)
    release.set()
    await asyncio.gather(*alices, bob)
    assert inside.count("alice") == 5
    one, other = lanes.client("wh1"), lanes.client("wh2")
    assert one is not other and lanes.client("wh1") is one  # no pool is shared
    await lanes.close_all()


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("answer", ["64:ff9b::a9fe:a9fe", "2002:a00:1::1", "::ffff:0:a00:1"])
async def test_a_name_whose_dns_answer_embeds_ipv4_is_refused_at_each_attempt(
    answer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def resolve(host: str, port: int) -> list[Address]:
        return [ipaddress.ip_address("93.184.216.34"), ipaddress.ip_address(answer)]

    monkeypatch.setattr(transport, "resolve", resolve)
    _, sent = await attempt("https://rebinding.example/hook", timeout_s=2.0)
    assert sent.status_code is None
    assert "refused" in sent.error and "embeds an IPv4" in sent.error

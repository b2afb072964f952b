"""The gateway's connection budget on a real uvicorn server and real sockets: half-sent
requests time out, one address cannot hold more than its share, idle connections make
room for a client that sends its request, and a slow body is cut."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
import uvicorn
from prometheus_client import REGISTRY

from services.gateway.connections import ConnectionBudget, fd_budget, guarded_protocol


async def app(scope, receive, send):  # type: ignore[no-untyped-def]
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/slow":  # a long answer: no timeout of the request's applies
        await asyncio.sleep(2.5)
    answer = b"ok %d" % len(body)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [(b"content-length", str(len(answer)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": answer})


@dataclass
class Served:
    port: int
    budget: ConnectionBudget


@pytest.fixture
def served(request: pytest.FixtureRequest) -> Iterator[Served]:
    limits = {
        "max_connections": 40,
        "per_client": 10,
        "idle_most": 20,
        "header_timeout_s": 1.0,
        "body_timeout_s": 1.0,
        **getattr(request, "param", {}),
    }
    budget = ConnectionBudget(**limits)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        http=guarded_protocol(budget),
        log_config=None,
        access_log=False,
        timeout_keep_alive=30,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    yield Served(port, budget)
    server.should_exit = True
    thread.join(10)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    client = socket.create_connection(("127.0.0.1", port), timeout=5, source_address=(source, 0))
    return client


def read_all(client: socket.socket) -> bytes:
    chunks = []
    while True:
        try:
            chunk = client.recv(65536)
        except (ConnectionResetError, TimeoutError):
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks)


def get(port: int, source: str = "127.0.0.1") -> bytes:
    with connect(port, source) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        return read_all(client)


def refused(reason: str) -> float:
    labels = {"reason": reason}
    return REGISTRY.get_sample_value("gpuloom_gateway_connections_refused_total", labels) or 0.0


def test_a_request_whose_headers_never_finish_gets_408_and_is_closed(served: Served) -> None:
    before = refused("header_timeout")
    with connect(served.port) as client:
        client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # no blank line: never complete
        started = time.monotonic()
        answer = read_all(client)
    assert answer.startswith(b"HTTP/1.1 408 "), answer
    assert b"no complete request headers in 1 s" in answer
    assert b"content-type: application/problem+json" in answer
    assert answer.endswith(b'"detail":"no complete request headers in 1 s"}')
    assert refused("header_timeout") == before + 1
    assert 0.8 < time.monotonic() - started < 4
    assert served.budget.open_count == 0 or wait_until(lambda: served.budget.open_count == 0)


def test_a_silent_connection_is_closed_after_the_header_timeout(served: Served) -> None:
    with connect(served.port) as client:
        started = time.monotonic()
        answer = read_all(client)
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert time.monotonic() - started < 4


@pytest.mark.parametrize("served", [{"header_timeout_s": 5.0}], indirect=True)
def test_a_body_that_drips_is_cut_at_the_body_timeout(served: Served) -> None:
    with connect(served.port) as client:
        client.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\nab")
        client.settimeout(0.2)
        started = time.monotonic()
        closed = False
        while not closed and time.monotonic() - started < 5:
            try:
                client.sendall(b"c")  # a byte every 0.2 s: no read ever waits long
                closed = client.recv(4096) == b""
            except TimeoutError:
                continue
            except OSError:
                closed = True
        elapsed = time.monotonic() - started
    assert closed and elapsed < 3, "the dripping body held its connection past the body timeout"


def test_an_answer_that_takes_long_is_not_cut(served: Served) -> None:
    with connect(served.port) as client:
        client.sendall(b"POST /slow HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nab")
        assert read_all_until(client, b"ok 2").startswith(b"HTTP/1.1 200 ")


def read_all_until(client: socket.socket, end: bytes) -> bytes:
    answer = b""
    while not answer.endswith(end):
        chunk = client.recv(4096)
        if not chunk:
            break
        answer += chunk
    return answer


def test_one_address_may_not_hold_more_than_its_share(served: Served) -> None:
    held = [connect(served.port, "127.0.0.2") for _ in range(10)]
    try:
        wait_until(lambda: served.budget.open_by_client["127.0.0.2"] == 10)
        open_now = REGISTRY.get_sample_value("gpuloom_gateway_connections", {"state": "open"})
        assert open_now == 10
        with connect(served.port, "127.0.0.2") as one_more:
            answer = read_all(one_more)
        assert answer.startswith(b"HTTP/1.1 429 "), answer
        assert b"retry-after: 1" in answer
        assert b"ok 0" in get(served.port)  # another address is served
    finally:
        for client in held:
            client.close()


def test_idle_connections_make_room_for_one_that_sends_its_request(served: Served) -> None:
    sources = [f"127.0.0.{3 + i // 10}" for i in range(40)]  # 4 addresses, 10 each
    held = [connect(served.port, source) for source in sources]
    try:
        wait_until(lambda: served.budget.open_count + len(served.budget.refused) >= 20)
        assert len(served.budget.idle) <= 20
        assert b"ok 0" in get(served.port)  # the oldest idle one was closed for it
        assert served.budget.open_count <= 40
    finally:
        for client in held:
            client.close()


@pytest.mark.parametrize("served", [{"max_connections": 8, "idle_most": 8}], indirect=True)
def test_past_every_connection_with_none_idle_a_new_one_gets_503(served: Served) -> None:
    busy = []
    for i in range(8):  # requests in progress: their bodies are still coming
        client = connect(served.port, f"127.0.1.{i + 1}")
        client.sendall(b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\na")
        busy.append(client)
    try:
        wait_until(lambda: served.budget.open_count == 8 and not served.budget.idle)
        answer = get(served.port)
        assert answer.startswith(b"HTTP/1.1 503 "), answer
        assert b"retry-after: 1" in answer
    finally:
        for client in busy:
            client.close()


def test_keep_alive_serves_several_requests_and_counts_the_connection_once(
    served: Served,
) -> None:
    with connect(served.port) as client:
        for _ in range(3):
            client.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert client.recv(4096).startswith(b"HTTP/1.1 200 ")
        assert served.budget.open_by_client["127.0.0.1"] == 1
        assert list(served.budget.idle)  # between requests it is idle
    assert wait_until(lambda: served.budget.open_count == 0)
    assert not served.budget.open_by_client


def test_the_descriptor_budget_leaves_the_reserve() -> None:
    most, soft = fd_budget(1_000_000, 256)
    assert most == soft - 256
    assert fd_budget(100, 256)[0] == 100


def wait_until(check, timeout: float = 5.0) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)
    return True

"""One delivery attempt over HTTP, to an address checked first (`policy.address_problem`).

The host is resolved here and every address it has is checked; the request then goes
to the checked address itself (with the URL's host in `Host` and, for https, in the TLS
server name, so the certificate is still verified against it). A name that resolves to
a public address when checked and to 127.0.0.1 when connecting (DNS rebinding) so gets
no chance. Redirects are not followed: a 3xx is a failed attempt (so no second address
is ever reached without being checked).

An attempt cannot be turned against its sender (the webhooks process): resolving,
connecting, sending and reading the answer together have one deadline (a receiver that
drips a byte at a time does not hold it longer), and at most `READ_MAX` bytes of the
answer are read, raw (no compression is asked for, so nothing is inflated); a connection whose
answer was cut short or ran out of time is closed, not kept for the next attempt.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

import httpx

from gpuloom.webhooks.policy import RESPONSE_KEPT, Address, address_problem

USER_AGENT = "gpuloom-webhooks/1"
#: The most bytes of an answer's body read (the rest is never read: the connection is
#: closed); `RESPONSE_KEPT` characters of them are kept.
READ_MAX = 4096
_URL = re.compile(r"https?://\S*")


class Refused(Exception):
    """The URL's host may not be delivered to (or cannot be resolved: `Unresolved`)."""


class Unresolved(Refused):
    """The URL's host has no address now."""


@dataclass(frozen=True, slots=True)
class Answer:
    """What one attempt got: the status (None: no answer), why it failed, the start of
    the body, the `Retry-After` header, and how long it took."""

    status_code: int | None
    error: str | None
    response: str | None
    retry_after: str | None
    duration_ms: int


async def resolve(host: str, port: int) -> list[Address]:
    """The addresses of `host` (itself when it is an address)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    try:
        found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise Unresolved(f"{host} does not resolve: {exc.strerror}") from exc
    except UnicodeError as exc:  # a label longer than DNS takes
        raise Unresolved(f"{host} is not a name DNS can resolve: {exc}") from exc
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]
    return sorted(set(addresses), key=lambda a: (a.version, int(a)))


async def checked_address(url: str, allow_private: bool) -> Address:
    """The address to connect to for `url`: every address of its host must be allowed."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    addresses = await resolve(host, port)
    if not addresses:
        raise Unresolved(f"{host} has no address")
    for address in addresses:
        problem = address_problem(address, allow_private)
        if problem is not None:
            raise Refused(f"{host}: {problem}")
    return addresses[0]


def pinned_url(url: str, address: Address) -> str:
    """`url` with its host replaced by `address` (the port and path kept)."""
    parts = urlsplit(url)
    literal = f"[{address}]" if address.version == 6 else str(address)
    netloc = literal if parts.port is None else f"{literal}:{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path or "/", parts.query, ""))


async def send(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    *,
    allow_private: bool,
    timeout_s: float,
) -> Answer:
    """POST `body` to `url` once, within `timeout_s` in all; never raises for the
    receiver's failures."""
    started = time.perf_counter()

    def took() -> int:
        return int((time.perf_counter() - started) * 1000)

    try:
        async with asyncio.timeout(timeout_s):
            return await _post(client, url, body, headers, allow_private, timeout_s, took)
    except TimeoutError:
        return Answer(None, f"no complete answer within {timeout_s:g} s", None, None, took())


async def _post(
    client: httpx.AsyncClient,
    url: str,
    body: bytes,
    headers: dict[str, str],
    allow_private: bool,
    timeout_s: float,
    took: Callable[[], int],
) -> Answer:
    try:
        address = await checked_address(url, allow_private)
    except Refused as exc:
        return Answer(None, f"refused: {exc}"[:500], None, None, took())
    parts = urlsplit(url)
    host_header = parts.netloc.rpartition("@")[2]
    extensions = {"sni_hostname": parts.hostname} if parts.scheme == "https" else {}
    request_headers = {
        **headers,
        "Host": host_header,
        "Content-Type": "application/cloudevents+json",
        "User-Agent": USER_AGENT,
        "Accept-Encoding": "identity",
    }
    request = client.build_request(
        "POST",
        pinned_url(url, address),
        content=body,
        headers=request_headers,
        timeout=timeout_s,
        extensions=extensions,
    )
    try:
        answer = await client.send(request, stream=True)
        try:
            head = await _head(answer)
        finally:
            await answer.aclose()  # unread: the connection is closed, not pooled
    except httpx.HTTPError as exc:
        return Answer(None, _error(exc), None, None, took())
    text = head.decode("utf-8", errors="replace")[:RESPONSE_KEPT] if head else None
    error = None if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"
    return Answer(answer.status_code, error, text, answer.headers.get("retry-after"), took())


async def _head(answer: httpx.Response) -> bytes:
    """The first `READ_MAX` bytes of the answer's body (raw), never more."""
    kept = bytearray()
    async for chunk in answer.aiter_raw():
        kept += chunk[: READ_MAX - len(kept)]
        if len(kept) >= READ_MAX:
            break
    return bytes(kept)


def _error(exc: httpx.HTTPError) -> str:
    """What went wrong, without the URL (its path and query may hold a secret)."""
    return _URL.sub("<url>", f"{type(exc).__name__}: {exc}")[:500]

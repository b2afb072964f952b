"""Receivers kept apart: each webhook has its own HTTP client, and attempts in flight
are bounded in all and per owner.

A webhook's client holds at most one connection (its deliveries go one at a time, in
log order), kept alive between attempts to the same receiver; no pool is shared, so a
receiver that holds its connection open holds only its own. The slots bound what the
webhooks process spends on receivers at once (`webhook_max_in_flight`) and keep one owner's
webhooks from taking them all (`webhook_max_in_flight_per_owner`): a user with many slow
receivers waits for their own slots, not others. Slots are taken owner first, then
the shared one, so a webhook waiting for its owner's slot holds nothing shared; each is
held at most one attempt's deadline per delivery.
"""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import httpx

#: How long a receiver's idle connection is kept for its webhook's next attempt.
KEEPALIVE_S = 30.0


class Lanes:
    def __init__(self, total: int, per_owner: int) -> None:
        self.total = total
        self.per_owner = per_owner
        self._shared = asyncio.Semaphore(total)
        self._owners: dict[str, asyncio.Semaphore] = {}
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._tls: ssl.SSLContext | None = None

    def client(self, hook_id: str) -> httpx.AsyncClient:
        """The webhook's own client: one connection at most, redirects not followed, no
        proxy from the environment (the address is checked and pinned)."""
        found = self._clients.get(hook_id)
        if found is None:
            if self._tls is None:  # one TLS context (the CA bundle loaded once) for all
                self._tls = httpx.create_ssl_context()
            found = httpx.AsyncClient(
                follow_redirects=False,
                trust_env=False,
                verify=self._tls,
                limits=httpx.Limits(
                    max_connections=1, max_keepalive_connections=1, keepalive_expiry=KEEPALIVE_S
                ),
            )
            self._clients[hook_id] = found
        return found

    @asynccontextmanager
    async def slot(self, owner: str) -> AsyncIterator[None]:
        """Hold one of `owner`'s slots and one shared slot while attempting."""
        mine = self._owners.setdefault(owner, asyncio.Semaphore(self.per_owner))
        async with mine, self._shared:
            yield

    async def close(self, hook_id: str) -> None:
        """Close the webhook's client (it was deleted or disabled)."""
        found = self._clients.pop(hook_id, None)
        if found is not None:
            await found.aclose()

    async def close_all(self) -> None:
        for hook_id in sorted(self._clients):
            await self.close(hook_id)

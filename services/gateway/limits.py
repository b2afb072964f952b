"""The gateway's size limit on request bodies: 413 before anything is parsed or published.

An ASGI middleware rather than a route check, so that no route reads a body past
the limit: a declared `Content-Length` over it is refused at once, and a body
sent without one (chunked) is counted as it streams and refused when it passes.
"""

from __future__ import annotations

from typing import Any

import orjson
from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from services.gateway.problems import MEDIA_TYPE, problem_body


class BodyTooLarge(HTTPException):
    """The streamed body passed the limit (raised inside `receive`).

    An HTTPException so that FastAPI, which answers any other error while it reads a
    body with 400, lets it through and answers 413.
    """

    def __init__(self, max_bytes: int) -> None:
        super().__init__(status_code=413, detail=_detail(max_bytes, f"passed {max_bytes} bytes"))


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_bytes:
            await self._refuse(send, f"declares {declared} bytes")
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._refuse(send, f"passed {self.max_bytes} bytes")

    async def _refuse(self, send: Send, what: str) -> None:
        await send_json(send, 413, problem_body(413, _detail(self.max_bytes, what)))


async def send_json(send: Send, status: int, doc: dict[str, Any]) -> None:
    body = orjson.dumps(doc)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", MEDIA_TYPE.encode()),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


def _detail(max_bytes: int, what: str) -> str:
    return (
        f"the request body {what}; the gateway takes at most {max_bytes} bytes "
        "(GPULOOM_MAX_BODY_BYTES)"
    )


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None

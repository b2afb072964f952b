"""Reading a Server-Sent Events stream (`GET /v1/events`), as the HTML standard's
parser does: `data:` lines joined with newlines, `id:` and `event:` kept, comment
lines (`:`) skipped, an event dispatched at each blank line."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SseEvent:
    data: str
    event: str = "message"
    id: str | None = None


def parse_sse(lines: Iterable[str]) -> Iterator[SseEvent]:
    """The events of a stream given line by line (without their line ends)."""
    data: list[str] = []
    event = ""
    last_id: str | None = None
    for line in lines:
        if not line:
            if data:
                yield SseEvent("\n".join(data), event or "message", last_id)
            data, event = [], ""
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
        elif field == "id" and "\0" not in value:
            last_id = value

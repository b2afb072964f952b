"""Following `GET /v1/events` from the command line: `gpuloom watch`, and the wait of
`gpuloom submit --wait`.

`follow` yields the CloudEvents of the stream in order and keeps going across dropped
connections: it reconnects with `Last-Event-ID` (the last sequence it saw), so nothing
is missed or repeated; a stream the gateway ended as `slow` is resumed the same way.
A position the log no longer holds (`gone`) or a refusal (4xx) ends it with an error.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from typing import Annotated, Any

import httpx
import typer

from gpuloom.client.api import GpuloomClient
from gpuloom.client.context import JsonFlag, gateway
from gpuloom.client.errors import ApiError, GatewayUnreachableError, error_from_response
from gpuloom.client.sse import parse_sse

#: How long to wait before reconnecting a dropped stream, seconds.
RECONNECT_S = 1.0
#: Reconnections in a row without an event before giving up.
MAX_RECONNECTS = 30


def follow(
    client: GpuloomClient,
    *,
    after: int | None = None,
    types: Sequence[str] = (),
    job: str | None = None,
    user: str | None = None,
    account: str | None = None,
    node: str | None = None,
) -> Iterator[dict[str, Any]]:
    """The events of the stream (CloudEvents as dicts), for ever, in order, resuming
    across dropped connections."""
    params: dict[str, Any] = {
        key: value
        for key, value in (("job", job), ("user", user), ("account", account), ("node", node))
        if value is not None
    }
    if types:
        params["type"] = list(types)
    last = None if after is None else str(after)
    failures = 0
    while True:
        headers = {"Last-Event-ID": last} if last is not None else {}
        try:
            with client.stream("GET", "/v1/events", params=params, headers=headers) as response:
                if response.is_error:
                    response.read()
                    raise error_from_response(response)
                for event in parse_sse(response.iter_lines()):
                    if event.event == "open":
                        last = event.id
                        continue
                    if event.event == "error":
                        ended = json.loads(event.data)
                        if ended.get("reason") == "slow":
                            last = str(ended["resume_after"])
                            break
                        raise ApiError(410, ended.get("detail") or "the stream ended")
                    failures = 0
                    last = event.id
                    yield json.loads(event.data)
        except (httpx.TransportError, GatewayUnreachableError) as exc:
            failures += 1
            if failures > MAX_RECONNECTS:
                raise GatewayUnreachableError(client.base_url, f"the stream broke: {exc}") from exc
        time.sleep(RECONNECT_S)


def event_line(event: dict[str, Any]) -> str:
    """One event for a terminal: sequence, time, type, subject, and what it says."""
    kind = event["type"].split(".")[3] if event["type"].count(".") >= 4 else event["type"]
    data = event.get("data") or {}
    said = " ".join(
        f"{key}={data[key]}"
        for key in ("node", "outcome", "exit_code", "reason", "attempt", "by")
        if data.get(key) not in (None, "", [])
    )
    return f"{event['gpuloomseq']:>9}  {event['time'][:19]}  {kind:<20} {event['subject']}  {said}"


def watch_command(
    ctx: typer.Context,
    job: Annotated[str | None, typer.Option(help="Only this job's events.")] = None,
    user: Annotated[str | None, typer.Option(help="Only the jobs of this user.")] = None,
    account: Annotated[
        str | None, typer.Option(help="Only this account's jobs and events.")
    ] = None,
    node: Annotated[str | None, typer.Option(help="Only events that name this node.")] = None,
    types: Annotated[
        list[str] | None, typer.Option("--type", help="Only this event type (repeatable).")
    ] = None,
    since: Annotated[
        int | None,
        typer.Option(min=0, help="Start after this sequence (0: the whole log) \\[default: now]."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Follow the cluster's events as they happen (resumes after a dropped connection)."""
    with gateway(ctx) as client:
        try:
            for event in follow(
                client, after=since, types=types or (), job=job, user=user,
                account=account, node=node,
            ):  # fmt: skip
                if as_json:
                    typer.echo(json.dumps(event, separators=(",", ":")))
                else:
                    typer.echo(event_line(event))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None

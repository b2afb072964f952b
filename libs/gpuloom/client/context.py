"""What every CLI command shares: the consoles, the root options' state, and the
translation of client errors into one red line and an exit code."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Annotated, Any, NoReturn

import httpx
import typer
from rich.console import Console, RenderableType
from rich.markup import escape

from gpuloom.client.api import DEFAULT_TIMEOUT_S, GpuloomClient, resolve_gateway_url
from gpuloom.client.credentials import resolve_token
from gpuloom.client.errors import ClientError

#: Width of tables written to a pipe or a file: wide enough never to cut an id.
#: The `--json` flag of every read command.
JsonFlag = Annotated[bool, typer.Option("--json", help="Print the gateway's raw JSON.")]
PIPE_WIDTH = 200

#: Messages and progress (stderr, never wrapped).
err = Console(stderr=True, highlight=False, soft_wrap=True)


def emit(*renderables: RenderableType) -> None:
    """Print tables on stdout: as wide as the terminal, or `PIPE_WIDTH` when piped."""
    width = None if sys.stdout.isatty() else PIPE_WIDTH
    console = Console(highlight=False, width=width)
    for renderable in renderables:
        console.print(renderable)


@dataclass
class CliState:
    """What the root options set for every command; tests inject `transport`."""

    url: str | None = None
    timeout: float = DEFAULT_TIMEOUT_S
    transport: httpx.BaseTransport | None = None
    poll_interval_s: float = 1.0
    #: The bearer token; None: `GPULOOM_TOKEN`, else the token file (credentials.py).
    token: str | None = None


def fail(message: str, code: int = 1) -> NoReturn:
    """Print `error: message` as one red line on stderr and exit with `code`."""
    err.print(f"[red]error: {escape(message)}[/red]")
    raise typer.Exit(code)


@contextmanager
def gateway(ctx: typer.Context) -> Iterator[GpuloomClient]:
    """A client of the chosen gateway, with the token; a `ClientError` inside becomes
    `fail(...)`.

    A bad `GPULOOM_GATEWAY_PORT` is a usage error (exit 2).
    """
    state = ctx.ensure_object(CliState)
    try:
        url = resolve_gateway_url(state.url)
    except ValueError as exc:
        fail(str(exc), 2)
    try:
        token = state.token or resolve_token()
        with GpuloomClient(url, state.timeout, state.transport, token) as client:
            yield client
            if client.stale is not None:
                err.print(
                    f"[yellow]note: the gateway's read model is {escape(client.stale)}: "
                    "this answer may be out of date[/yellow]"
                )
    except ClientError as exc:
        fail(str(exc))


def print_json(data: Any) -> None:
    """The gateway's JSON, indented, on stdout (no colour: fit for `jq`)."""
    typer.echo(json.dumps(data, indent=2, ensure_ascii=False))

"""`gpuloom bus ...`: the identities of a stack on NATS, for operators.

Every process connects to NATS as its own identity (`gpuloom.bus.identities`). The
seeds live in a keyring directory (default `<data_dir>/bus`, `make run`'s); the
server's users file (default `<data_dir>/nats.users.conf`) is rendered from it and
holds public keys only. A new node's agent needs an identity before it can connect:

    gpuloom bus add-agent agent-node-c --node node-c

writes its seed (`<data_dir>/bus/agent-node-c.seed`: give it to that agent as
`GPULOOM_NATS_SEED_FILE`), rewrites the users file and, when the server's pid file
is there (`make run`), makes it reload (SIGHUP). Elsewhere (compose, Kubernetes)
copy the users file where the server reads it and reload it yourself.

No process may create a stream (`gpuloom.bus.provision` says why): once the server
runs, and again after adding an agent, the operator creates the log and every
snapshot bucket, as the admin:

    gpuloom bus setup --nats nats://admin:PASSWORD@host:4222

Also `python -m gpuloom.client.buscmds ...`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from gpuloom.bus.credentials import connect_options
from gpuloom.bus.keyring import Keyring
from gpuloom.bus.provision import provision_at
from gpuloom.bus.streams import Expected
from gpuloom.client.context import emit, fail
from gpuloom.client.logcmds import resolve_nats_url
from gpuloom.config import load_settings
from gpuloom.natsserver import strip_credentials, write_users

app = typer.Typer(help="Identities on the bus (NATS): who may write which events.")

DataDir = Annotated[
    Path, typer.Option("--data-dir", envvar="GPULOOM_DATA_DIR", help="the stack's data folder")
]
KeyringDir = Annotated[
    Path | None, typer.Option("--keyring", help="seeds folder (default: DATA_DIR/bus)")
]
UsersFile = Annotated[
    Path | None,
    typer.Option("--users-file", help="nats-server users file (default: DATA_DIR/nats.users.conf)"),
]
Stream = Annotated[str, typer.Option(envvar="GPULOOM_STREAM", help="the log's stream")]


def _paths(data_dir: Path, keyring: Path | None, users: Path | None) -> tuple[Keyring, Path]:
    return Keyring(keyring or data_dir / "bus"), users or data_dir / "nats.users.conf"


def _reload(pid_file: Path) -> bool:
    """SIGHUP the server whose pid `pid_file` holds; False when there is none."""
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, signal.SIGHUP)
    except ProcessLookupError:
        return False
    return True


@app.command("users")
def users_command(
    data_dir: DataDir = Path(".gpuloom"),
    keyring: KeyringDir = None,
    users_file: UsersFile = None,
    stream: Stream = "GPULOOM",
) -> None:
    """Make the seeds of every service, `reader` and `admin` (once) and write the users file."""
    ring, users = _paths(data_dir, keyring, users_file)
    write_users(ring, users, stream)
    typer.echo(f"users file {users} (public keys only); seeds in {ring.root}")


@app.command("add-agent")
def add_agent_command(
    name: Annotated[str, typer.Argument(help="the agent's identity, e.g. agent-node-c")],
    node: Annotated[list[str], typer.Option("--node", help="a node it serves (repeat)")],
    data_dir: DataDir = Path(".gpuloom"),
    keyring: KeyringDir = None,
    users_file: UsersFile = None,
    stream: Stream = "GPULOOM",
    pid_file: Annotated[
        Path | None, typer.Option(help="nats-server's pid file (default: DATA_DIR/nats.pid)")
    ] = None,
) -> None:
    """Give agent NAME an identity for exactly its nodes, and reload the server."""
    ring, users = _paths(data_dir, keyring, users_file)
    try:
        ring.add_agent(name, node)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    write_users(ring, users, stream)
    typer.echo(f"agent {name} may write for {', '.join(sorted(set(node)))}")
    typer.echo(f"its seed: GPULOOM_NATS_SEED_FILE={ring.seed_file(name)}")
    if _reload(pid_file or data_dir / "nats.pid"):
        typer.echo("nats-server reloaded its users")
    else:
        typer.echo(f"no running server found: reload the one that reads {users} (SIGHUP)")


@app.command("setup")
def setup_command(
    nats: Annotated[
        str | None, typer.Option("--nats", help="the admin's NATS URL (default: make run's)")
    ] = None,
) -> None:
    """Create the log, its dead letters, the per-node view and every service's snapshot
    bucket that is missing, as the admin (GPULOOM_NATS_SEED_FILE=admin.seed, or a URL
    with the admin's password). Idempotent; changes nothing that exists."""
    try:
        url = resolve_nats_url(nats)
    except (ValueError, OSError) as exc:
        fail(str(exc), 2)
    settings = load_settings()
    expected = Expected(settings.dedup_window_s, settings.stream_replicas)
    work = provision_at(url, settings.stream, expected=expected, **connect_options(settings))
    try:
        created = asyncio.run(work)
    except Exception as exc:
        fail(f"cannot set up the bus at {strip_credentials(url)}: {exc!r}")
    emit(
        f"log {settings.stream}, its view and the snapshot buckets of every service are "
        f"there; created now: {', '.join(created) or 'none'}"
    )


@app.command("list")
def list_command(
    data_dir: DataDir = Path(".gpuloom"), keyring: KeyringDir = None, stream: Stream = "GPULOOM"
) -> None:
    """Each identity, its public key, and the event subjects it may publish."""
    ring, _ = _paths(data_dir, keyring, None)
    for identity in ring.identities(stream):
        publish = identity.permissions.publish
        events = ["everything"] if publish is None else [p for p in publish if ".evt." in p]
        typer.echo(f"{identity.name:<24} {identity.public_key}")
        for pattern in events:
            typer.echo(f"    {pattern}")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        app()

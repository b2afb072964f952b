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

Also `python -m gpuloom.client.buscmds ...`.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path
from typing import Annotated

import typer

from gpuloom.bus.keyring import Keyring
from gpuloom.natsserver import write_users

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

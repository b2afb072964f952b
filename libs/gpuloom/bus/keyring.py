"""The bus identities of one stack on disk: an nkey seed per identity, made on first use.

Layout of `root` (mode 0700; every file 0600; never in the repository):
- `<identity>.seed`: the nkey seed of each service, agent, `reader` and `admin`;
- `agents.json`: which nodes each agent identity serves (its permissions);
- `admin.password`: the admin user's password, for tools that take a URL
  (`nats://admin:PASSWORD@host`), tests among them.

nats-server's configuration holds only the public keys (`gpuloom.natsserver`); a
process gets the path of its own seed (`GPULOOM_NATS_SEED_FILE`) and nothing else.
"""

from __future__ import annotations

import json
import os
import secrets
from collections.abc import Sequence
from pathlib import Path

import nkeys

from gpuloom.bus.identities import (
    ADMIN,
    READER,
    SERVICES,
    Identity,
    check_token,
    identities,
    nodes_served,
)


def new_seed() -> bytes:
    """A fresh user nkey seed (`SU...`)."""
    return bytes(nkeys.encode_seed(os.urandom(32), nkeys.PREFIX_BYTE_USER))


def public_key_of(seed: bytes) -> str:
    key = nkeys.from_seed(bytearray(seed.strip()))
    try:
        return bytes(key.public_key).decode()
    finally:
        key.wipe()


def write_private(path: Path, data: bytes) -> None:
    """Write `data` to a new file readable by its owner only (never briefly wider)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)
    os.replace(tmp, path)


class Keyring:
    """Seeds and roster of one stack's bus identities, under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _dir(self) -> Path:
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        return self.root

    def seed_file(self, name: str) -> Path:
        return self.root / f"{check_token('identity', name)}.seed"

    def ensure(self, name: str) -> str:
        """The public key of identity `name`, its seed made on first use."""
        path = self.seed_file(name)
        if not path.exists():
            self._dir()
            write_private(path, new_seed())
        return public_key_of(path.read_bytes())

    def agents(self) -> dict[str, list[str]]:
        """agent identity -> the nodes it serves."""
        path = self.root / "agents.json"
        if not path.exists():
            return {}
        found: dict[str, list[str]] = json.loads(path.read_text())
        return found

    def add_agent(self, name: str, nodes: Sequence[str]) -> str:
        """Give agent `name` the identity for exactly `nodes` (replacing its previous
        nodes); return its public key. A node already served by another agent is refused."""
        agents = self.agents()
        agents[check_token("agent", name)] = sorted(set(nodes))
        nodes_served(agents)  # raises on a node with two agents, or a bad name
        if name in SERVICES or name in (READER, ADMIN):
            raise ValueError(f"{name!r} is not a name an agent may take")
        key = self.ensure(name)
        write_private(self._dir() / "agents.json", json.dumps(agents, indent=1).encode())
        return key

    def admin_password(self) -> str:
        """The admin user's password (made on first use)."""
        path = self.root / "admin.password"
        if not path.exists():
            self._dir()
            write_private(path, secrets.token_urlsafe(24).encode())
        return path.read_text().strip()

    def identities(self, stream: str) -> list[Identity]:
        """Every identity of the stack with its permissions; the services', the reader's
        and the admin's seeds are made on first use."""
        keys = {name: self.ensure(name) for name in (*SERVICES, READER, ADMIN)}
        agents = self.agents()
        keys.update({name: self.ensure(name) for name in agents})
        return identities(keys, agents, stream)

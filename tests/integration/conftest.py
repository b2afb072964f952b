"""Integration fixtures: a real NATS JetStream, a real database, real service processes.

Every cluster's log is audited when its tests are done: `gpuloom audit` must re-make
every placement decision the services wrote.

`cluster` runs on SQLite; `cluster_any_db` runs once per configured database
(SQLite, and PostgreSQL when GPULOOM_TEST_DATABASE_URL is set); `shared_cluster`
is one cluster for a whole module, for tests that only read or add jobs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from cluster_fixtures import running_cluster
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.bus import EventBus
from gpuloom.store.migrate import upgrade
from gpuloom.store.session import make_engine, make_sessionmaker
from gpuloom.testing.cluster import Cluster
from gpuloom.testing.servers import nats_jetstream


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    with nats_jetstream(tmp_path / "nats") as url:
        yield url


@pytest.fixture
def cluster(nats_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(
        nats_url, f"sqlite+aiosqlite:///{tmp_path}/gpuloom.db", tmp_path / "data"
    ) as c:
        yield c


@pytest.fixture
def webhook_cluster(nats_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """The cluster, retrying failed webhook deliveries after 0.2 s (five times)."""
    env = {"GPULOOM_WEBHOOK_RETRY_S": "[0.2, 0.2, 0.2, 0.2, 0.2]"}
    with running_cluster(
        nats_url, f"sqlite+aiosqlite:///{tmp_path}/gpuloom.db", tmp_path / "data", env=env
    ) as c:
        yield c


@pytest.fixture
def cluster_any_db(nats_url: str, database_url: str, tmp_path: Path) -> Iterator[Cluster]:
    with running_cluster(nats_url, database_url, tmp_path / "data") as c:
        yield c


@pytest.fixture(scope="module")
def shared_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("shared")
    with (
        nats_jetstream(base / "nats") as url,
        running_cluster(url, f"sqlite+aiosqlite:///{base}/gpuloom.db", base / "data") as c,
    ):
        yield c


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[async_sessionmaker[Any]]:
    """Sessions on an empty database migrated to the latest schema."""
    await upgrade(database_url)
    engine = make_engine(database_url)
    yield make_sessionmaker(engine)
    await engine.dispose()


@pytest.fixture
async def bus(nats_url: str) -> AsyncIterator[EventBus]:
    """A connection to the test's own NATS, the log created."""
    connected = await EventBus.connect(nats_url, "GPULOOM", name="test")
    yield connected
    await connected.close()

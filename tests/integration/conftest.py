"""Integration fixtures: a real NATS JetStream, a real database, real service processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuloom.testing.cluster import DEFAULT_NODES, Cluster
from gpuloom.testing.servers import nats_jetstream


@pytest.fixture
def nats_url(tmp_path: Path) -> Iterator[str]:
    with nats_jetstream(tmp_path / "nats") as url:
        yield url


@pytest.fixture
def cluster(nats_url: str, database_url: str, tmp_path: Path) -> Iterator[Cluster]:
    """The whole stack with node-a (4 x A100-80GB) and node-b (2 x H100-80GB), one agent each."""
    agents = {"agent-a": [DEFAULT_NODES[0]], "agent-b": [DEFAULT_NODES[1]]}
    running = Cluster(nats_url, database_url, tmp_path / "data", agents).start()
    try:
        running.wait_nodes_ready(2)
        yield running
    finally:
        running.stop()
        for log in sorted((tmp_path / "data" / "logs").glob("*.log")):
            text = log.read_text(errors="replace")
            if "Traceback" in text:
                print(f"--- {log.name} (tail) ---\n{text[-4000:]}")

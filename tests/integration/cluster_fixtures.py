"""The integration tests' running cluster, importable by test modules (a module named
`conftest` is not: pytest loads several, and `import conftest` finds any of them)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from gpuloom.testing.cluster import DEFAULT_NODES, Cluster


@contextlib.contextmanager
def running_cluster(
    nats_url: str, database_url: str, data_dir: Path, env: dict[str, str] | None = None
) -> Iterator[Cluster]:
    """node-a (4 x A100-80GB) and node-b (2 x H100-80GB), one agent process each."""
    agents = {"agent-a": [DEFAULT_NODES[0]], "agent-b": [DEFAULT_NODES[1]]}
    running = Cluster(nats_url, database_url, data_dir, agents, env=env or {})
    try:
        running.start()
        running.wait_nodes_ready(2)
        yield running
        running.assert_audit_passes()
    finally:
        running.stop()
        for log in sorted((data_dir / "logs").glob("*.log")):
            text = log.read_text(errors="replace")
            if "Traceback" in text:
                print(f"--- {log.name} (tail) ---\n{text[-4000:]}")

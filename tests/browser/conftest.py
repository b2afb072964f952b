"""Browser fixtures: the real stack (as tests/integration's `shared_cluster`: NATS,
every service, node-a with 4 x A100 and node-b with 2 x H100, one module), and Debian's
chromium driven by Playwright (its own browsers cannot be downloaded here).

Only a missing chromium skips (`.ci/run` installs it); anything else fails.
Screenshots go to `$GPULOOM_ARTIFACTS` when set (e.g. docs/screenshots to refresh the
README's), else to a temporary directory; the path is printed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from dashboard_helpers import Dashboard
from playwright.sync_api import Browser, ConsoleMessage, sync_playwright

from gpuloom.testing.cluster import DEFAULT_NODES, Cluster
from gpuloom.testing.servers import nats_jetstream

CHROMIUM = Path(os.environ.get("GPULOOM_CHROMIUM", "/usr/bin/chromium"))
VIEWPORT = {"width": 1400, "height": 900}


@pytest.fixture(scope="module")
def ui_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base = tmp_path_factory.mktemp("dashboard")
    agents = {"agent-a": [DEFAULT_NODES[0]], "agent-b": [DEFAULT_NODES[1]]}
    with nats_jetstream(base / "nats") as url:
        cluster = Cluster(url, f"sqlite+aiosqlite:///{base}/gpuloom.db", base / "data", agents)
        try:
            cluster.start()
            cluster.wait_nodes_ready(2)
            yield cluster
            cluster.assert_audit_passes()
        finally:
            cluster.stop()


@pytest.fixture(scope="module")
def browser(ui_cluster: Cluster) -> Iterator[Browser]:
    """After the cluster (Playwright's sync API keeps an event loop running in this
    thread: the cluster's own asyncio.run, at start and for the audit, must not meet it)."""
    if not CHROMIUM.exists():
        pytest.skip(f"no chromium at {CHROMIUM}: apt-get install chromium (as .ci/run does)")
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        yield launched
        launched.close()


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("GPULOOM_ARTIFACTS")
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("dashboard-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    print(f"\ndashboard screenshots: {path.resolve()}")
    return path


@pytest.fixture
def ui(browser: Browser, ui_cluster: Cluster, artifacts: Path) -> Iterator[Dashboard]:
    context = browser.new_context(viewport=VIEWPORT)  # type: ignore[arg-type]
    page = context.new_page()
    page.set_default_timeout(15_000)
    dashboard = Dashboard(page, ui_cluster.gateway_url, artifacts)

    def console(message: ConsoleMessage) -> None:
        if message.type == "error":
            dashboard.errors.append(message.text)

    page.on("console", console)
    page.on("pageerror", lambda error: dashboard.errors.append(f"uncaught: {error}"))
    yield dashboard
    context.close()

"""The gateway's /metrics and /docs, in process: the cluster gauges computed from a
folded log, /metrics at its exact path, and API docs that need no internet."""

from __future__ import annotations

import asyncio
import re
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from fastapi import FastAPI
from prometheus_client.core import Metric

from gpuloom.config import Settings
from gpuloom.events import (
    AuditCompleted,
    ReservationCreated,
    ReservationSpec,
    ReservationStarted,
    ReservedGpu,
)
from gpuloom.testing.builders import LogBuilder
from services.gateway import metrics as metrics_module
from services.gateway.app import create_app
from services.gateway.metrics import serve_scrapes
from services.gateway.reads.gauges import cluster_metrics


def samples(metrics: list[Metric]) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for metric in metrics
        for sample in metric.samples
    }


def test_cluster_gauges_count_jobs_gpus_and_recent_placements() -> None:
    log = LogBuilder()
    log.register("a", gpus=4, model="A100-80GB")
    log.register("h", gpus=2, model="H100-80GB")
    log.register("gone", gpus=8, model="A100-80GB")
    log.lose("gone")
    log.run_to_queue("early", gpus=1, gpu_model=["H100-80GB"])
    log.place("early", "h", [0])
    log.start("early", "h")
    log.finish("early", "h")
    log.run_to_queue("train", gpus=2)
    log.place("train", "a", [1, 2], after=120)  # from here on: the last minute
    log.start("train", "a")
    log.run_to_queue("waits", gpus=4)
    log.run_to_queue("short", gpus=1)  # placed, ended and charged within the minute
    log.place("short", "a", [3], after=10)
    log.start("short", "a")
    log.finish("short", "a", after=5)
    log.charge("short", seconds=5)
    state = log.state()
    assert "short" in state.tombstones and "short" not in state.jobs
    got = samples(cluster_metrics(state, log.now))

    def job_count(state: str) -> float:
        return got[("gpuloom_jobs", (("state", state),))]

    assert (job_count("running"), job_count("queued"), job_count("succeeded")) == (1, 1, 2)
    assert job_count("cancelled") == 0
    assert got[("gpuloom_queue_length", ())] == 1
    a100 = (("model", "A100-80GB"), ("pool", "physical"))
    h100 = (("model", "H100-80GB"), ("pool", "physical"))
    assert got[("gpuloom_gpus", a100)] == 4  # the lost node's 8 are not capacity
    assert got[("gpuloom_gpus_allocated", a100)] == 2
    assert got[("gpuloom_gpu_milli", a100)] == 4000
    assert got[("gpuloom_gpu_milli_allocated", a100)] == 2000
    assert got[("gpuloom_gpus_partly_allocated", a100)] == 0
    assert got[("gpuloom_account_gpu_milli_allocated", (("account", "research"),))] == 2000
    assert got[("gpuloom_gpus", h100)] == 2
    assert got[("gpuloom_gpus_allocated", h100)] == 0
    assert got[("gpuloom_nodes", (("state", "lost"),))] == 1
    assert got[("gpuloom_nodes", (("state", "ready"),))] == 2
    assert got[("gpuloom_placements_total", ())] == 3
    assert got[("gpuloom_placements_last_minute", ())] == 2  # train and short
    later = samples(cluster_metrics(log.state(), log.now + timedelta(minutes=5)))
    assert later[("gpuloom_placements_last_minute", ())] == 0


def test_reserved_gpus_and_the_idle_ones_of_active_reservations_are_gauges() -> None:
    log = LogBuilder()
    log.register("a", 4)
    start = log.now + timedelta(seconds=30)
    spec = ReservationSpec(
        start=start,
        end=start + timedelta(hours=1),
        gpus=[ReservedGpu(node="a", index=i) for i in (0, 1, 2)],
        users=["alice"],
    )
    log.append(ReservationCreated(name="big", spec=spec))
    got = samples(cluster_metrics(log.state(), log.now))
    pending = (("maint", "false"), ("reservation", "big"), ("state", "pending"))
    assert got[("gpuloom_gpus_reserved", pending)] == 3
    log.append(ReservationStarted(name="big"), at=start)
    log.run_to_queue("mine", gpus=1, reservation="big")
    log.place("mine", "a", [1])
    got = samples(cluster_metrics(log.state(), log.now))
    active = (("maint", "false"), ("reservation", "big"), ("state", "active"))
    assert got[("gpuloom_gpus_reserved", active)] == 3
    assert got[("gpuloom_gpus_reserved_idle", (("reservation", "big"),))] == 2


def test_the_queue_heads_wait_and_the_last_audits_mismatches_are_gauges() -> None:
    log = LogBuilder()
    log.register("a", 1)
    log.run_to_queue("first", gpus=1)
    log.run_to_queue("second", gpus=1, after=60)
    log.append(
        AuditCompleted(audit_id="a1", from_seq=1, to_seq=5, verified=4, mismatch_count=2,
                       mismatches=["x", "y"], seconds=0.1),
        after=600,
    )  # fmt: skip
    got = samples(cluster_metrics(log.state(), log.now))
    submitted = log.state().jobs["first"].submitted_at
    assert got[("gpuloom_queue_head_wait_seconds", ())] == (log.now - submitted).total_seconds()
    assert got[("gpuloom_audit_mismatches", ())] == 2
    empty = samples(cluster_metrics(LogBuilder().state(), log.now))
    assert empty[("gpuloom_queue_head_wait_seconds", ())] == 0
    assert empty[("gpuloom_audit_mismatches", ())] == 0


async def get(app: FastAPI, path: str) -> httpx.Response:
    """GET on the app itself, without its lifespan (no NATS needed for these routes)."""
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as http:
        return await http.get(path, follow_redirects=False)


def gateway_app(tmp_path: Path, name: str = "gw", **settings: object) -> FastAPI:
    return create_app(
        Settings(
            database_url=f"sqlite+aiosqlite:///{tmp_path}/{name}.db",
            data_dir=tmp_path,
            **settings,  # type: ignore[arg-type]
        )
    )


async def test_metrics_answers_at_its_path_in_every_app_of_a_process(tmp_path: Path) -> None:
    apps = [gateway_app(tmp_path, name, metrics_public=True) for name in ("one", "two")]
    for app in apps:
        response = await get(app, "/metrics")
        assert response.status_code == 200, response.headers
        assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
        assert "# TYPE gpuloom_events_folded_total counter" in response.text


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
async def test_api_docs_load_only_assets_the_gateway_serves(tmp_path: Path, page: str) -> None:
    app = gateway_app(tmp_path)
    html = await get(app, page)
    assert html.status_code == 200
    urls = re.findall(r"""(?:src|href)=["']([^"']+)["']""", html.text)
    assert urls, html.text
    for url in urls:
        assert not urlsplit(url).netloc, f"{page} loads {url} from elsewhere"
        asset = await get(app, url)
        assert asset.status_code == 200, url
        assert len(asset.content) > 1000, url


async def test_the_metrics_port_answers_get_metrics_only_and_drops_a_silent_client(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_module, "SCRAPE_REQUEST_TIMEOUT_S", 0.3)

    async def scrape() -> bytes:
        return b"# the scrape\n"

    server = await serve_scrapes(scrape, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]

    async def ask(request: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        answer = await asyncio.wait_for(reader.read(), 5)
        writer.close()
        return answer

    try:
        answer = await ask(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert answer.startswith(b"HTTP/1.1 200 OK\r\n") and answer.endswith(b"# the scrape\n")
        assert (await ask(b"GET /v1/jobs HTTP/1.1\r\n\r\n")).startswith(b"HTTP/1.1 404 ")
        assert await ask(b"GET /metr") == b""  # never finished: closed at the timeout
        silent = [
            await asyncio.open_connection("127.0.0.1", port)
            for _ in range(metrics_module.SCRAPES_AT_ONCE + 2)
        ]
        scraped = await asyncio.wait_for(ask(b"GET /metrics HTTP/1.1\r\n\r\n"), 0.25)
        assert scraped.startswith(b"HTTP/1.1 200 OK")  # the silent ones hold no turn
        for _, writer in silent:
            writer.close()
    finally:
        server.close()
        await server.wait_closed()

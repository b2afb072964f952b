"""/readyz and /v1/projections: the projection's lag and quarantine, as operators see them.

Real NATS and real databases; the first tests mount the router over the gateway's read
model and a read-model writer (`Projector`, the process `services.projector` runs) that
the test drives (to hold it back, or to make its database refuse a row); one runs the
whole gateway application beside a writer.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import Depends, FastAPI
from projection_helpers import Refusing, put, refused_value, submit
from sqlalchemy.ext.asyncio import async_sessionmaker

from gpuloom.auth import OPERATOR, Principal, issue_token, read_secret
from gpuloom.bus import EventBus
from gpuloom.bus.provision import provision_at
from gpuloom.config import Settings
from gpuloom.runtime.projector import CHECKPOINT, Projector
from services.gateway.app import attach_read_model, create_app
from services.gateway.auth import authenticate
from services.gateway.freshness import Freshness
from services.gateway.parts import Gateway
from services.gateway.projections.routes import public, router
from services.gateway.readiness import Readiness
from services.gateway.readmodel import ReadModel

pytestmark = pytest.mark.integration


@pytest.mark.parametrize(
    ("lags", "expected"),
    [
        ([5], "starting"),
        ([5, 0], "ready"),
        ([0, 5], "ready"),
        ([0, 5, 5], "lagging"),
        ([0, 5, 5, 1], "ready"),
        ([0, 5, 1, 5], "ready"),
    ],
    ids=[
        "behind since start: not ready",
        "caught up once: ready",
        "a burst within the grace: still ready",
        "behind longer than the grace: not ready",
        "back within the lag: ready again",
        "the grace restarts after catching up",
    ],
)
def test_readiness_from_lag_samples(lags: list[int], expected: str) -> None:
    readiness = Readiness(max_lag=1, grace_s=5)
    status = ""
    for sample, lag in enumerate(lags):  # one probe every 6 s
        status = readiness.observe(lag, now=sample * 6.0)
    assert status == expected


def mounted(gateway: Gateway) -> httpx.AsyncClient:
    app = FastAPI()
    app.state.gateway = gateway
    app.include_router(router, dependencies=[Depends(authenticate)])
    app.include_router(public)
    app.dependency_overrides[authenticate] = lambda: Principal("ops", frozenset({OPERATOR}))
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://localhost")


async def test_readyz_waits_for_the_replay_and_for_a_stalled_projection(
    database_url: str, nats_url: str, sessions: async_sessionmaker[Any], bus: EventBus
) -> None:
    settings = Settings(nats_url=nats_url, database_url=database_url)
    projector = Projector(bus, sessions)
    read_model = ReadModel(bus, sessions)
    gateway = Gateway(settings=settings, sessions=sessions, bus=bus, read_model=read_model)
    gateway.readiness = Readiness(max_lag=1, grace_s=0.3)
    last = await put(bus, *(submit(f"job-{i}") for i in range(5)))
    following = asyncio.Event()
    gateway_task = asyncio.create_task(read_model.run(following))
    async with mounted(gateway) as http:
        assert await read_model.wait_folded(last, 15)
        response = await http.get("/readyz")  # folded, but the rows are not written yet
        assert response.status_code == 503
        assert response.json()["status"] == "starting"
        assert response.json()["lag"] == last

        stop = asyncio.Event()
        task = asyncio.create_task(projector.run(stop))
        assert await read_model.wait_for(last, 15)
        response = await http.get("/readyz")
        assert response.status_code == 200
        assert response.json() | {"detail": ""} == {
            "ready": True, "status": "ready", "lag": 0, "stream_seq": last, "written_seq": last,
            "max_lag": 1, "quarantined": 0, "detail": "",
        }  # fmt: skip

        stop.set()  # the writer stalls while the log grows (the gateway's fold goes on)
        await task
        behind = await put(bus, submit("late-1"), submit("late-2"))
        assert await read_model.wait_folded(behind, 15)
        response = await http.get("/readyz")
        assert response.status_code == 200  # within the grace
        await asyncio.sleep(0.4)
        response = await http.get("/readyz")
        assert response.status_code == 503
        assert response.json()["status"] == "lagging"
        assert response.json()["lag"] == behind - last
    following.set()
    await gateway_task


async def test_projections_list_checkpoint_lag_and_the_quarantined_row(
    database_url: str, nats_url: str, sessions: async_sessionmaker[Any], bus: EventBus
) -> None:
    settings = Settings(nats_url=nats_url, database_url=database_url)
    projector = Projector(bus, sessions, job_row=Refusing(refused_value(database_url)))
    read_model = ReadModel(bus, sessions)
    gateway = Gateway(settings=settings, sessions=sessions, bus=bus, read_model=read_model)
    stop = asyncio.Event()
    tasks = [asyncio.create_task(projector.run(stop)), asyncio.create_task(read_model.run(stop))]
    try:
        last = await put(bus, submit("good-1"), submit("bad-forever"), submit("good-2"))
        assert await read_model.wait_for(last, 15)
        await read_model.read_checkpoint()  # the quarantine, as the gateway reads it
        async with mounted(gateway) as http:
            body = (await http.get("/v1/projections")).json()
            assert (await http.get("/readyz")).json()["quarantined"] == 1
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    assert body["stream_seq"] == last
    (view,) = [p for p in body["projections"] if p["name"] == CHECKPOINT]
    assert (view["checkpoint"], view["written_seq"], view["lag"]) == (last, last, 0)
    assert view["quarantined"] == 1
    (row,) = view["rows"]
    assert (row["kind"], row["key"], row["seq"]) == ("job", "bad-forever", 2)
    assert row["error"]
    assert row["row"]["jobs"]["id"] == "bad-forever"


async def test_the_gateway_is_ready_when_caught_up_and_reports_the_lag(
    database_url: str, nats_url: str, tmp_path: Path, sessions: async_sessionmaker[Any]
) -> None:
    await provision_at(nats_url, "GPULOOM")  # as `gpuloom bus setup`: no service creates it
    settings = Settings(nats_url=nats_url, database_url=database_url, data_dir=tmp_path)
    app = create_app(settings)
    writer_bus = await EventBus.connect(nats_url, "GPULOOM", name="projector", create=False)
    stop = asyncio.Event()
    writer = asyncio.create_task(Projector(writer_bus, sessions).run(stop))  # its process
    transport = httpx.ASGITransport(app=app)
    secret = read_secret(settings.secret_file())  # made by the gateway
    token = issue_token(secret, "ops", now=datetime.now(UTC), ttl_s=600, roles=[OPERATOR])
    auth = {"Authorization": f"Bearer {token}"}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://localhost", headers=auth) as http,
    ):
        job = {"name": "n", "user": "u", "account": "a", "command": ["true"], "gpus": 0}
        for _ in range(200):  # the gateway connects to NATS in the background
            submitted = await http.post("/v1/jobs", json=job)
            if submitted.status_code != 503:
                break
            await asyncio.sleep(0.05)
        assert submitted.status_code in (201, 202), submitted.text
        assert (await http.get(f"/v1/jobs/{submitted.json()['id']}")).status_code == 200
        ready = await http.get("/readyz")
        assert ready.status_code == 200, ready.text
        assert ready.json()["lag"] == 0 and ready.json()["status"] == "ready"
        projections = (await http.get("/v1/projections")).json()
        (view,) = [p for p in projections["projections"] if p["name"] == CHECKPOINT]
        assert view["lag"] == 0 and view["checkpoint"] == projections["stream_seq"] >= 1
        assert (await http.get("/healthz")).json()["status"] == "ok"  # liveness unchanged
    stop.set()
    await writer
    await writer_bus.close()


async def test_reads_say_they_are_stale_until_the_replay_reaches_the_end_of_the_log(
    database_url: str, nats_url: str, sessions: async_sessionmaker[Any], bus: EventBus
) -> None:
    settings = Settings(nats_url=nats_url, database_url=database_url, ready_max_lag=0)
    gateway = Gateway(settings=settings, sessions=sessions)
    last = await put(bus, *(submit(f"stale-{i}") for i in range(4)))
    app = FastAPI()
    app.add_middleware(Freshness, gateway=gateway)
    app.state.gateway = gateway
    app.include_router(router, dependencies=[Depends(authenticate)])
    app.include_router(public)
    app.dependency_overrides[authenticate] = lambda: Principal("ops", frozenset({OPERATOR}))
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=app), base_url="http://localhost"
    ) as http:
        before = await http.get("/v1/projections")  # no connection to the log yet
        assert before.headers["gpuloom-stale"] == "unavailable"
        assert "gpuloom-projection-lag" not in before.headers

        read_model = await attach_read_model(gateway, bus)
        replaying = await http.get("/v1/projections")
        assert replaying.headers["gpuloom-stale"] == "starting"
        assert int(replaying.headers["gpuloom-projection-lag"]) == last

        following, stop = asyncio.Event(), asyncio.Event()
        gateway_task = asyncio.create_task(read_model.run(following))
        assert await read_model.wait_folded(last, 15)
        stale = await http.get("/v1/projections")  # folded; the rows are not written yet
        assert stale.headers["gpuloom-stale"] == "starting"
        task = asyncio.create_task(Projector(bus, sessions).run(stop))
        assert await read_model.wait_for(last, 15)
        fresh = await http.get("/v1/projections")
        assert "gpuloom-stale" not in fresh.headers
        assert fresh.headers["gpuloom-projection-lag"] == "0"
        assert "gpuloom-stale" not in (await http.get("/readyz")).headers  # reads only

        stop.set()  # the writer stalls while the log grows past ready_max_lag
        await task
        await put(bus, submit("stale-late"))
        await read_model.lag_behind_stream()
        late = await http.get("/v1/projections")
        assert late.headers["gpuloom-stale"] == "lagging"
        assert late.headers["gpuloom-projection-lag"] == "1"
        following.set()
        await gateway_task

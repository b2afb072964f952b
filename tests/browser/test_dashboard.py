"""The dashboard at /ui in a real browser against the real stack (docs/dashboard.md):
log in with a real token, follow jobs live on the GPU map, in the queue, the jobs
view and a job's page, as the event stream tells, without a reload and without
polling; a stream that drops resumes where it was; a wrong token gets the login
form with the reason; the pages are static, strict, and never parse data as HTML."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from dashboard_helpers import CuttableProxy, Dashboard
from playwright.sync_api import Request, Route, expect

from gpuloom.auth import OPERATOR
from gpuloom.testing.cluster import Cluster
from services.gateway.ui.routes import STATIC

pytestmark = pytest.mark.integration

#: A name that would be markup if the page parsed data as HTML.
HOSTILE = 'train <img src=x onerror="window.pwned=1"> llm'


def submit(client: httpx.Client, **job: Any) -> str:
    body = {"account": "research", "command": ["true"], "gpus": 1, **job}
    answer = client.post("/v1/jobs", json=body)
    assert answer.status_code == 202, answer.text
    job_id: str = answer.json()["id"]
    return job_id


def test_the_dashboard_follows_jobs_live(ui: Dashboard, ui_cluster: Cluster) -> None:
    cluster, page = ui_cluster, ui.page
    alice, bob = cluster.client_for("alice"), cluster.client_for("bob")
    bobs = submit(bob, name="bobs-job")
    cluster.wait_final([bobs])

    ui.login(cluster.token_for("alice"))
    expect(page.locator("#who-name")).to_have_text("alice")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    page.evaluate("window.sameDocument = true")  # gone if anything reloads the page

    # a job that holds both H100s for a few seconds, and one that waits for them
    command = ["sh", "-c", "echo hello from the GPUs; sleep 6"]
    running = submit(
        alice, name=HOSTILE, gpus=2, gpu_model=["H100-80GB"], time_limit_s=120, command=command
    )
    cluster.wait_state([running], "running")
    placed = cluster.job(running)
    assert placed["gpus"], placed
    for gpu in placed["gpus"]:
        held = page.locator(
            f'.gpu[data-node="{placed["node"]}"][data-gpu="{gpu}"] li[data-job="{running}"]'
        )
        expect(held).to_contain_text("alice")
    for block, node in (("b1", "node-a"), ("b2", "node-b")):  # grouped by topology
        section = page.locator(f'section.domain[data-level="block"][data-domain="{block}"]')
        expect(section.locator(f'article[data-node="{node}"]')).to_contain_text("rack r")
    ui.shot("map")

    page.click('nav a[data-view="queue"]')
    expect(page.locator(".view-queue")).to_contain_text("Nothing waits")
    waiting = submit(alice, name="eval", gpus=2, gpu_model=["H100-80GB"], command=["sleep", "1"])
    expect(page.locator(f'.queue-table tr[data-job="{waiting}"]')).to_contain_text("Resources")
    ui.shot("queue")

    page.click('nav a[data-view="jobs"]')
    row = page.locator(f'tr[data-job-id="{running}"]')
    expect(row).to_have_attribute("data-state", "running")
    expect(row.locator("td.name")).to_have_text(HOSTILE)  # text, not markup
    expect(page.locator(f'tr[data-job-id="{waiting}"]')).to_have_attribute("data-state", "queued")
    expect(page.locator(f'tr[data-job-id="{bobs}"]')).to_have_count(0)  # alice's jobs only
    ui.shot("jobs")

    row.locator("a").first.click()
    expect(page.locator("#job-state")).to_have_text("running")
    last = page.locator("#timeline li").last
    expect(last).to_have_attribute("data-type", "JobFinished", timeout=30_000)
    expect(last).to_contain_text("succeeded")
    expect(page.locator("#job-state")).to_have_text("succeeded")
    expect(page.locator("#stdout")).to_have_text("hello from the GPUs\n")
    ui.shot("job")

    page.click('nav a[data-view="jobs"]')
    expect(page.locator(f'tr[data-job-id="{waiting}"]')).to_have_attribute(
        "data-state", "succeeded", timeout=30_000
    )
    page.goto(f"{ui.base_url}/ui/#/usage?range=15m")
    expect(page.locator('.totals-list li[data-key="research"]')).to_contain_text("2 jobs")
    expect(page.locator("#chart-groups canvas")).to_have_count(1)
    ui.shot("usage")
    page.select_option("#usage-by", "gpu_model")  # over time by GPU model (both ran on H100s)
    expect(page.locator("#chart-groups .u-legend")).to_contain_text("H100-80GB")

    assert page.evaluate("window.sameDocument") is True
    assert page.evaluate("window.pwned") is None
    # nothing happens now: the page asks the API nothing (no polling)
    page.wait_for_timeout(1500)
    asked: list[str] = []

    def api_call(request: Request) -> None:
        if "/v1/" in request.url or "/healthz" in request.url:
            asked.append(request.url)

    page.on("request", api_call)
    page.wait_for_timeout(2500)
    assert asked == []
    assert ui.errors == []


def test_reservations_show_on_the_map_and_in_the_queue_live(
    ui: Dashboard, ui_cluster: Cluster
) -> None:
    """An operator's advance reservation (docs/reservations.md) marks its GPUs on the map
    and is listed in the queue, as the event stream tells, without a reload; its
    description is text, never markup."""
    cluster, page = ui_cluster, ui.page
    ui.login(cluster.token_for("alice"))
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    page.evaluate("window.sameDocument = true")
    expect(page.locator(".gpu").first).to_be_visible()
    ops = cluster.client_for("ops", [OPERATOR])
    start = datetime.now(UTC) + timedelta(hours=2)
    body = {
        "name": "big-run", "start": start.isoformat(), "duration_s": 3600,
        "nodes": ["node-b"], "users": ["alice"], "description": HOSTILE,
    }  # fmt: skip
    made = ops.post("/v1/reservations", json=body)
    assert made.status_code == 201, made.text
    for gpu in (0, 1):
        booked = page.locator(f'.gpu[data-node="node-b"][data-gpu="{gpu}"] .reserved-by')
        expect(booked).to_have_attribute("data-reservation", "big-run")
        expect(booked).to_contain_text("reserved big-run from")
    expect(page.locator('.gpu[data-node="node-a"] .reserved-by')).to_have_count(0)
    ui.shot("map-reserved")
    page.click('nav a[data-view="queue"]')
    row = page.locator('tr[data-reservation="big-run"]')
    expect(row).to_contain_text("pending")
    expect(row).to_contain_text(HOSTILE)  # text, not markup
    assert ops.delete("/v1/reservations/big-run").status_code == 204
    expect(row).to_have_count(0)
    assert page.evaluate("window.sameDocument") is True
    assert page.evaluate("window.pwned") is None
    assert ui.errors == []


def test_the_usage_view_shows_what_runs_now_before_it_is_charged(
    ui: Dashboard, ui_cluster: Cluster
) -> None:
    """A running job's GPU time shows at once, marked as not yet charged (accounting
    charges a run every few minutes and at its end)."""
    cluster, page = ui_cluster, ui.page
    alice = cluster.client_for("alice")
    ui.login(cluster.token_for("alice"))
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    running = submit(alice, name="long", command=["sleep", "60"], time_limit_s=120)
    cluster.wait_state([running], "running")
    page.goto(f"{ui.base_url}/ui/#/usage?range=15m")
    now = page.locator('ul[data-totals="running"] li[data-key="alice (research)"]')
    expect(now).to_contain_text("1 job")
    assert alice.delete(f"/v1/jobs/{running}").status_code == 202
    cluster.wait_final([running])
    expect(now).to_have_count(0)  # it ended: its time is charged now, not running
    assert ui.errors == []


def test_the_stream_resumes_after_a_drop(ui: Dashboard, ui_cluster: Cluster) -> None:
    gateway = httpx.URL(ui_cluster.gateway_url)
    proxy = CuttableProxy((gateway.host, gateway.port or 80))
    ui.base_url = proxy.url  # the page talks to the gateway through the proxy
    try:
        page = ui.page
        ui.login(ui_cluster.token_for("alice"))
        page.click('nav a[data-view="jobs"]')
        live = page.locator("#live")
        expect(live).to_have_attribute("data-state", "live")
        proxy.cut()
        expect(live).to_have_attribute("data-state", "reconnecting")
        missed = submit(ui_cluster.client_for("alice"), name="while-cut", command=["true"])
        ui_cluster.wait_final([missed])
        proxy.resume()
        expect(live).to_have_attribute("data-state", "live", timeout=20_000)
        # what it missed came from the log after its last event, not from a reload
        row = page.locator(f'tr[data-job-id="{missed}"]')
        expect(row).to_have_attribute("data-state", "succeeded")
        assert any(b"last-event-id: " in chunk.lower() for chunk in proxy.sent)
    finally:
        proxy.close()


def test_a_wrong_token_gets_the_login_form_with_the_reason(
    ui: Dashboard, ui_cluster: Cluster
) -> None:
    page = ui.page
    ui.open()
    page.fill("#token", "not-a-token")
    page.click("#login-submit")
    expect(page.locator("#login-error")).to_contain_text(
        "The gateway refused the token: malformed token"  # the gateway's reason
    )
    expect(page.locator("#topbar")).to_be_hidden()
    assert page.evaluate("sessionStorage.length") == 0
    assert "not-a-token" not in page.url
    ui.shot("login")
    assert all("401" in error for error in ui.errors), ui.errors


def test_the_pages_are_static_strict_and_build_no_html_from_data(ui_cluster: Cluster) -> None:
    with httpx.Client(base_url=ui_cluster.gateway_url, timeout=10) as http:  # no token
        assert http.get("/ui").headers["location"] == "/ui/"
        for path in (
            "/ui/",
            "/ui/app.js",
            "/ui/style.css",
            "/ui/vendor/uPlot.iife.min.js",
            "/ui/nope",
        ):
            answer = http.get(path)
            assert answer.status_code == (404 if path == "/ui/nope" else 200), path
            policy = answer.headers["content-security-policy"]
            assert "default-src 'self'" in policy and "script-src 'self'" in policy
            assert "unsafe" not in policy
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["referrer-policy"] == "no-referrer"
            assert answer.headers["x-frame-options"] == "DENY"
        assert http.get("/ui/%2e%2e/routes.py").status_code == 404
        assert http.get("/v1/nodes").status_code == 401  # the data stays behind the token
    html = (STATIC / "index.html").read_text()
    assert not re.search(r"<script(?![^>]*\bsrc=)", html), "an inline script"
    assert not re.search(r"\s(style|on[a-z]+)=", html), "an inline style or handler"
    for module in sorted(STATIC.glob("*.js")):
        code = module.read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval("):
            assert sink not in code, f"{module.name} uses {sink}"


def test_times_in_a_reason_read_as_the_page_s_other_times(ui: Dashboard) -> None:
    """A reason carries the log's times (ISO 8601, UTC: "to start at 2026-...T...+00:00");
    the queue, the job list and a job's page show them in local time, as their other
    columns do."""
    page = ui.page
    page.goto(f"{ui.base_url}/ui/")
    shown = page.evaluate(
        """async () => {
            const dom = await import("/ui/dom.js");
            const iso = "2026-12-07T08:15:00.250000+00:00";
            return [dom.localTimes(`Resources: held to start at ${iso} on node-a`), dom.when(iso),
                    dom.localTimes("its turn"), dom.localTimes(null)];
        }"""
    )
    text, local, plain, nothing = shown
    assert text == f"Resources: held to start at {local} on node-a", text
    assert "T08:15" not in text and "+00:00" not in text
    assert (plain, nothing) == ("its turn", None)


def test_a_finished_array_s_page_lists_its_tasks(ui: Dashboard, ui_cluster: Cluster) -> None:
    """`#/jobs/<array id>`: the array's tasks with their states, nodes and exit codes
    (not "Not placed"), each a link to its own page; live while they run."""
    cluster, page = ui_cluster, ui.page
    alice = cluster.client_for("alice")
    ui.login(cluster.token_for("alice"))
    command = ["sh", "-c", 'test "$GPULOOM_ARRAY_INDEX" != 2']  # task 2 fails
    array = submit(alice, name="sweep", array=3, command=command)
    page.goto(f"{ui.base_url}/ui/#/jobs/{array}")
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    for index, state, code in ((0, "succeeded", "0"), (1, "succeeded", "0"), (2, "failed", "1")):
        row = page.locator(f'tr[data-task="{array}-{index}"]')
        expect(row).to_have_attribute("data-state", state)  # as the tasks end, live
        expect(row.locator("td").nth(3)).to_have_text(code)
        expect(row.locator("td").nth(2)).to_have_text(re.compile(r"^node-[ab]$"))
    expect(page.locator('.array-states li[data-state="succeeded"]')).to_contain_text("2")
    expect(page.get_by_text("Not placed.")).to_have_count(0)
    page.locator(f'tr[data-task="{array}-2"] a').click()
    expect(page.locator("#job-state")).to_contain_text("failed")
    assert ui.errors == []


def test_a_failed_gpu_shows_on_the_map_live_until_it_is_resumed(
    ui: Dashboard, ui_cluster: Cluster
) -> None:
    """A GPU whose health check fails (docs/faults.md) is marked out of service on the
    map, with what its agent saw (text, never markup), and back once an operator
    resumes it, as the event stream tells, without a reload."""
    cluster, page = ui_cluster, ui.page
    ui.login(cluster.token_for("alice"))
    expect(page.locator("#live")).to_have_attribute("data-state", "live")
    page.evaluate("window.sameDocument = true")
    tile = page.locator('.gpu[data-node="node-b"][data-gpu="1"]')
    expect(tile).to_be_visible()
    cluster.inject_faults(("node-b", 1, "xid", f"Xid 79 {HOSTILE}"))
    expect(tile).to_have_class(re.compile(r"\bunhealthy\b"))
    expect(tile.locator(".fault")).to_contain_text("out of service")
    expect(tile.locator(".fault")).to_contain_text(f"xid (Xid 79 {HOSTILE})")
    ui.shot("map-gpu-failed")
    cluster.inject_faults()
    ops = cluster.client_for("ops", [OPERATOR])
    resumed = ops.post("/v1/nodes/node-b/gpus/1/resume", json={"reason": "drill"})
    assert resumed.status_code == 202, resumed.text
    expect(tile.locator(".fault")).to_have_count(0)
    assert page.evaluate("window.sameDocument") is True
    assert page.evaluate("window.pwned") is None
    assert ui.errors == []


def test_a_page_refreshes_again_while_the_rows_lag_behind_the_stream(
    ui: Dashboard, ui_cluster: Cluster
) -> None:
    """The stream may tell of an event before the rows the API reads hold it (a busy
    projector: `/healthz`'s `projection_seq` behind). The page does not wait for the
    next event to show it: it refreshes again until the rows caught up. Here the rows
    are held back (the job's page answered as it stood while running) for 8 s: past the
    3 s the page waits for them after the job's last events (its end, its charge)."""
    cluster, page = ui_cluster, ui.page
    alice = cluster.client_for("alice")
    ui.login(cluster.token_for("alice"))
    job_id = submit(alice, name="slow-rows", command=["sh", "-c", "sleep 1"])
    cluster.wait_state([job_id], "running")
    page.goto(f"{ui.base_url}/ui/#/jobs/{job_id}")
    expect(page.locator("#job-state")).to_contain_text("running")
    while_running = alice.get(f"/v1/jobs/{job_id}").json()
    lagging = True

    def healthz(route: Route) -> None:
        if not lagging:
            route.continue_()
            return
        answer = route.fetch()
        route.fulfill(response=answer, json={**answer.json(), "projection_seq": 0})

    def the_job(route: Route) -> None:
        if lagging:
            route.fulfill(json=while_running)
        else:
            route.continue_()

    page.route("**/healthz", healthz)
    page.route(re.compile(rf".*/v1/jobs/{job_id}$"), the_job)
    cluster.wait_final([job_id])
    page.wait_for_timeout(8000)  # every refresh for the job's last events found them behind
    expect(page.locator("#job-state")).to_contain_text("running")
    lagging = False
    expect(page.locator("#job-state")).to_contain_text("succeeded", timeout=10_000)
    page.unroute_all(behavior="wait")  # no handler left running as the page closes
    assert ui.errors == []

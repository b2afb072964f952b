"""Pools, fractions, models, locality and node selectors with the real services.

Three simulated nodes: node-a with 4 physical A100s, node-b with 2 H100s in the
vGPU pool that it lends as remote vGPU, node-c with 2 A100s in the vGPU pool
(zone b, not lending). Every job prints the variables gpuloom sets, so the test
checks the placement from the log, the projection and the job's own environment.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuloom.testing.cluster import Cluster, SimNode
from gpuloom.testing.servers import nats_jetstream

NODES = {
    "agent-a": [SimNode("node-a", "A100-80GB", 4)],
    "agent-b": [SimNode("node-b", "H100-80GB", 2, pool="vgpu", lends_remote_vgpu=True)],
    "agent-c": [SimNode("node-c", "A100-80GB", 2, pool="vgpu", labels=(("zone", "b"),))],
}
SHOW_ENV = ["sh", "-c", "sleep 1; env | grep -E '^(CUDA|GPULOOM)' | sort"]


@pytest.fixture(scope="module")
def pools(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    base: Path = tmp_path_factory.mktemp("pools")
    with nats_jetstream(base / "nats") as url:
        cluster = Cluster(url, f"sqlite+aiosqlite:///{base}/gpuloom.db", base / "data", NODES)
        try:
            cluster.start()
            cluster.wait_nodes_ready(3)
            yield cluster
            cluster.assert_audit_passes(forged="gpu_indexes: recorded [7]")  # the audit test's
        finally:
            cluster.stop()


def job_env(cluster: Cluster, job_id: str) -> dict[str, str]:
    stdout = cluster.http.get(f"/v1/jobs/{job_id}/logs").json()["stdout"]
    return dict(line.split("=", 1) for line in stdout.splitlines() if "=" in line)


def test_each_kind_of_request_lands_where_the_rules_allow(pools: Cluster) -> None:
    jobs = {
        "whole": pools.submit(gpus=1, pool="physical", command=SHOW_ENV),
        "fraction": pools.submit(gpus=1, gpu_milli=250, gpu_model=["A100-80GB"], command=SHOW_ENV),
        "h100-half": pools.submit(gpus=1, gpu_milli=500, gpu_model=["H100-80GB"], command=SHOW_ENV),
        "selected": pools.submit(
            gpus=1,
            gpu_milli=300,
            gpu_memory_mib=1024,
            node_selector={"zone": "b"},
            command=SHOW_ENV,
        ),
        "remote": pools.submit(
            gpus=3,
            gpu_milli=200,
            gpu_model=["A100-80GB", "H100-80GB"],
            locality="local-first",
            command=SHOW_ENV,
        ),
        "cpu-only": pools.submit(gpus=0, command=SHOW_ENV),
    }
    done = pools.wait_final(jobs.values(), timeout=60)
    assert {name: done[j]["state"] for name, j in jobs.items()} == dict.fromkeys(jobs, "succeeded")

    whole = job_env(pools, jobs["whole"])
    assert done[jobs["whole"]]["node"] == "node-a"
    assert len(whole["CUDA_VISIBLE_DEVICES"].split(",")) == 1
    assert "GPULOOM_GPU_MILLI" not in whole

    fraction = job_env(pools, jobs["fraction"])
    assert done[jobs["fraction"]]["node"] == "node-c"  # the only A100s in the vGPU pool
    assert fraction["GPULOOM_GPU_MILLI"] == "250"
    assert fraction["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    assert fraction["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"  # 25% of 80 GiB

    assert done[jobs["h100-half"]]["node"] == "node-b"
    selected = job_env(pools, jobs["selected"])
    assert done[jobs["selected"]]["node"] == "node-c"
    assert selected["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"

    # 3 slices: no node has 3 vGPUs; node-c hosts with its 2, node-b lends the third
    remote = job_env(pools, jobs["remote"])
    placement = done[jobs["remote"]]["placement"]
    assert done[jobs["remote"]]["node"] == "node-c" and len(placement) == 1
    assert sorted(s["node"] for s in placement[0]["slices"]) == ["node-b", "node-c", "node-c"]
    [lent] = [s for s in placement[0]["slices"] if s["node"] == "node-b"]
    assert remote["GPULOOM_REMOTE_GPUS"] == f"node-b/{lent['uuid']}:200:16384"
    assert len(remote["CUDA_VISIBLE_DEVICES"].split(",")) == 2

    assert job_env(pools, jobs["cpu-only"])["CUDA_VISIBLE_DEVICES"] == ""


def test_fractions_share_a_gpu_and_nodes_show_who_holds_what(pools: Cluster) -> None:
    sleepers = [
        pools.submit(gpus=1, gpu_milli=400, gpu_model=["H100-80GB"], command=["sleep", "30"])
        for _ in range(4)
    ]
    pools.wait_state(sleepers, "running", timeout=30)
    node_b = next(n for n in pools.http.get("/v1/nodes").json()["nodes"] if n["name"] == "node-b")
    assert node_b["lends_remote_vgpu"] is True
    for gpu in node_b["gpus"]:
        assert gpu["pool"] == "vgpu"
        assert gpu["milli_allocated"] == 800, "two 400-milli slices per H100"
        assert gpu["memory_allocated_mib"] == 2 * 32768
        assert sorted(h["job_id"] for h in gpu["holders"]) == sorted(
            j for j in sleepers if any(h["job_id"] == j for h in gpu["holders"])
        )
    # a GPU with work on it cannot change pool
    refused = pools.http.post("/v1/nodes/node-b/gpus/0/pool", json={"pool": "physical"})
    assert refused.status_code == 409 and "in use" in refused.json()["detail"]
    for job_id in sleepers:
        pools.http.delete(f"/v1/jobs/{job_id}")
    pools.wait_final(sleepers, timeout=30)


def test_an_idle_gpu_moves_between_pools(pools: Cluster) -> None:
    moved = pools.http.post("/v1/nodes/node-a/gpus/3/pool", json={"pool": "vgpu"})
    assert moved.status_code == 202, moved.text
    gpu = next(
        g
        for n in pools.http.get("/v1/nodes").json()["nodes"]
        if n["name"] == "node-a"
        for g in n["gpus"]
        if g["index"] == 3
    )
    assert gpu["pool"] == "vgpu"
    # now node-a can host an A100 fraction on its own GPU 3
    job = pools.submit(
        gpus=1, gpu_milli=100, gpu_model=["A100-80GB"], node_selector={}, command=["true"]
    )
    assert pools.wait_final([job])[job]["state"] == "succeeded"
    back = pools.http.post("/v1/nodes/node-a/gpus/3/pool", json={"pool": "physical"})
    assert back.status_code == 202, back.text
    unknown = pools.http.post("/v1/nodes/node-a/gpus/9/pool", json={"pool": "vgpu"})
    assert unknown.status_code == 404


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"gpus": 1, "gpu_milli": 0}, "gpu_milli"),
        ({"gpus": 1, "gpu_milli": 1000}, "gpu_milli"),
        ({"gpus": 1, "gpu_milli": 500, "pool": "physical"}, "vgpu pool"),
        ({"gpus": 0, "gpu_milli": 500}, "gpu_milli"),
        ({"gpus": 1, "gpu_memory_mib": 100}, "gpu_memory_mib"),
        ({"gpus": 1, "locality": "nearby"}, "locality"),
    ],
)
def test_bad_gpu_requests_get_422_naming_the_problem(
    pools: Cluster, body: dict[str, object], field: str
) -> None:
    response = pools.http.post(
        "/v1/jobs", json={"name": "bad", "user": "u", "account": "a", "command": ["true"], **body}
    )
    assert response.status_code == 422
    assert field in response.text


def test_requests_nobody_can_serve_are_refused_with_the_reason(pools: Cluster) -> None:
    job = {"name": "x", "user": "alice", "account": "research", "command": ["true"]}
    three_local = pools.http.post("/v1/jobs", json={**job, "gpus": 3, "gpu_milli": 300})
    assert three_local.status_code == 422, three_local.text
    assert "largest node has 2" in three_local.json()["errors"][0]["msg"]
    h100_physical = pools.http.post(
        "/v1/jobs", json={**job, "gpus": 1, "pool": "physical", "gpu_model": ["H100-80GB"]}
    )
    assert h100_physical.status_code == 422, h100_physical.text
    assert "physical" in h100_physical.json()["errors"][0]["msg"]
    # one that merely cannot run now is queued: all 4 A100s of node-a, twice
    first = pools.submit(gpus=4, gpu_model=["A100-80GB"], command=["sleep", "1"])
    second = pools.submit(gpus=4, gpu_model=["A100-80GB"], command=["true"])
    done = pools.wait_final([first, second], timeout=60)
    assert done[first]["state"] == done[second]["state"] == "succeeded"


def test_gpuloom_audit_verifies_the_log_and_catches_a_forged_decision(pools: Cluster) -> None:
    from typer.testing import CliRunner

    from gpuloom.audit.verify import CYCLE_EVENTS
    from gpuloom.bus import EventBus, Outgoing
    from gpuloom.client.cli import app
    from gpuloom.events import JobPlaced, encode, make_envelope, subject_for

    extra = [pools.submit(gpus=1, gpu_milli=100, command=["true"]) for _ in range(3)]
    pools.wait_final(extra, timeout=30)
    runner = CliRunner()
    passed = runner.invoke(app, ["audit", "--nats", pools.nats_url])
    assert passed.exit_code == 0, passed.output
    assert "0 mismatches" in passed.output
    records = pools.read_log()
    placed = [r for r in records if isinstance(r.event, JobPlaced)]
    decisions = [r for r in records if isinstance(r.event, CYCLE_EVENTS)]  # reservations too
    assert placed
    view = pools.http.get("/v1/audit").json()
    deadline = time.monotonic() + 10
    while not view["audited"] and time.monotonic() < deadline:
        view = pools.http.get("/v1/audit").json()
    assert view["audited"] and view["mismatch_count"] == 0
    assert view["verified"] == len(decisions)

    # a hand-made decision: a recorded one, moved to other GPUs
    original = placed[-1].event
    forged = original.model_copy(update={"gpu_indexes": [7], "cycle_position": 0})

    async def publish() -> None:
        bus = await EventBus.connect(pools.nats_url, "GPULOOM", name="forger")
        envelope = make_envelope(forged, at=placed[-1].envelope.at, by="placement")
        await bus.publish(
            Outgoing(subject_for(forged), encode(envelope), {"Nats-Msg-Id": "forged"})
        )
        await bus.close()

    asyncio.run(publish())
    caught = runner.invoke(app, ["audit", "--nats", pools.nats_url, "--json"])
    assert caught.exit_code == 1, caught.output
    assert f"job {original.job_id}" in caught.output and "gpu_indexes" in caught.output

    at_seq = placed[0].seq
    replay = runner.invoke(app, ["replay", "--nats", pools.nats_url, "--at", str(at_seq), "--json"])
    assert replay.exit_code == 0, replay.output
    assert f'"seq": {at_seq}' in replay.output


def test_a_gang_is_placed_whole_and_every_replica_runs(pools: Cluster) -> None:
    gang = pools.submit(gpus=2, replicas=3, gpu_model=["A100-80GB"], command=SHOW_ENV)
    too_big = pools.http.post(
        "/v1/jobs",
        json={"name": "big", "user": "alice", "account": "research", "command": ["true"],
              "gpus": 2, "replicas": 4, "gpu_model": ["A100-80GB"]},
    )  # fmt: skip
    done = pools.wait_final([gang], timeout=60)
    job = done[gang]
    assert job["state"] == "succeeded", job
    hosts = sorted(replica["host"] for replica in job["placement"])
    assert hosts == ["node-a", "node-a", "node-c"], "3 x 2 A100s: node-a twice, node-c once"
    env = job_env(pools, gang)  # replica 0's output
    assert env["GPULOOM_REPLICA"] == "0" and env["GPULOOM_REPLICAS"] == "3"
    assert env["GPULOOM_REPLICA_HOSTS"].split(",") == [r["host"] for r in job["placement"]]
    events = pools.http.get(f"/v1/jobs/{gang}/events").json()["events"]
    replicas_started = sorted(e["data"]["replica"] for e in events if e["type"] == "JobStarted")
    replicas_finished = sorted(e["data"]["replica"] for e in events if e["type"] == "JobFinished")
    assert replicas_started == replicas_finished == [0, 1, 2]
    # 4 x 2 A100s exist (node-a 4, node-c 2 = 3 pairs) only as 3: a gang of 4 never fits
    assert too_big.status_code == 422, too_big.text
    assert too_big.json()["errors"][0]["loc"] == ["body", "replicas"]


def test_usage_reports_equal_a_recomputation_from_the_log(pools: Cluster) -> None:
    from gpuloom.events import UsageCharged

    quarter = pools.submit(gpus=1, gpu_milli=250, gpu_model=["H100-80GB"], command=["sleep", "1"])
    pools.wait_final([quarter])
    deadline = time.monotonic() + 20
    while True:
        charges = [r.event for r in pools.read_log() if isinstance(r.event, UsageCharged)]
        report = pools.http.get("/v1/usage").json()
        charged_jobs = {c.job_id for c in charges}
        if quarter in charged_jobs and sum(a["jobs"] for a in report["accounts"]) == len(
            charged_jobs
        ):
            break
        assert time.monotonic() < deadline, "the ledger never caught up with the log"
        time.sleep(0.3)
    by_account: dict[str, int] = {}
    by_model: dict[str, int] = {}
    for charge in charges:
        by_account[charge.account] = by_account.get(charge.account, 0) + charge.gpu_milli_seconds
        for model, milli_seconds in charge.by_model.items():
            by_model[model] = by_model.get(model, 0) + milli_seconds
    assert {a["account"]: round(a["gpu_seconds"] * 1000) for a in report["accounts"]} == by_account
    assert {
        m["gpu_model"]: round(m["gpu_seconds"] * 1000) for m in report["gpu_models"]
    } == by_model
    # a fraction is charged by its share: 0.25 GPU for its run time
    [mine] = [c for c in charges if c.job_id == quarter]
    assert mine.gpu_milli_seconds == round(250 * mine.seconds)
    records = pools.http.get("/v1/usage/jobs", params={"account": "research"}).json()["records"]
    assert quarter in {r["job_id"] for r in records}
    # each run's GPU time split by model, as the log's charges split it
    [run] = [r for r in records if r["job_id"] == quarter]
    assert {m: round(s * 1000) for m, s in run["gpu_models"].items()} == mine.by_model
    assert round(sum(run["gpu_models"].values()) * 1000) == round(run["gpu_seconds"] * 1000)
    csv_text = pools.http.get("/v1/usage", params={"group_by": "gpu_model", "format": "csv"}).text
    assert csv_text.splitlines()[0] == "gpu_model,gpu_seconds,gpu_hours,jobs"
    assert any(line.startswith("H100-80GB,") for line in csv_text.splitlines())
    before_all = pools.http.get("/v1/usage", params={"until": "2000-01-01T00:00:00Z"}).json()
    assert before_all["accounts"] == [] and before_all["gpu_models"] == []


def test_dependencies_run_in_order_and_arrays_expand(pools: Cluster) -> None:
    first = pools.submit(gpus=1, pool="physical", command=["sleep", "3"])
    second = pools.submit(gpus=1, pool="physical", command=["true"], depends_on=[{"job": first}])
    # fails after a second: the jobs that depend on it are queued by then, so the queue
    # cancels `never` (had it failed before `never` was admitted, admission would reject it)
    doomed = pools.submit(gpus=0, command=["sh", "-c", "sleep 1; exit 1"])
    never = pools.submit(gpus=0, command=["true"], depends_on=[{"job": doomed}])
    after_any = pools.submit(
        gpus=0, command=["true"], depends_on=[{"job": doomed, "when": "finished"}]
    )
    ghost = pools.submit(gpus=0, command=["true"], depends_on=[{"job": "no-such-job"}])
    deadline = time.monotonic() + 5
    while (waiting := pools.job(second))["state"] != "queued":  # first runs for 3 s
        assert waiting["state"] in ("submitted", "admitted"), waiting
        assert time.monotonic() < deadline, waiting
        time.sleep(0.1)
    assert waiting["reason"].startswith("Dependency: waiting for"), waiting
    done = pools.wait_final([first, second, doomed, never, after_any, ghost], timeout=60)
    assert done[first]["state"] == done[second]["state"] == "succeeded"
    assert done[second]["started_at"] >= done[first]["finished_at"]
    assert done[never]["state"] == "cancelled"
    assert done[never]["reason"].startswith("DependencyNeverSatisfied")
    assert done[after_any]["state"] == "succeeded"
    assert done[ghost]["state"] == "rejected" and "unknown job no-such-job" in done[ghost]["reason"]

    body = {
        "name": "sweep",
        "user": "alice",
        "account": "research",
        "gpus": 0,
        "array": 3,
        "command": ["sh", "-c", "echo index=$GPULOOM_ARRAY_INDEX of=$GPULOOM_ARRAY_ID"],
    }
    answer = pools.http.post("/v1/jobs", json=body, headers={"Idempotency-Key": "sweep-1"})
    assert answer.status_code == 202, answer.text
    array = answer.json()
    assert array["tasks"] == [f"{array['id']}-{i}" for i in range(3)]
    again = pools.http.post("/v1/jobs", json=body, headers={"Idempotency-Key": "sweep-1"}).json()
    assert again["tasks"] == array["tasks"], "a retried array submission makes no new tasks"
    finished = pools.wait_final(array["tasks"], timeout=60)
    assert all(job["state"] == "succeeded" for job in finished.values())
    for index, task in enumerate(array["tasks"]):
        stdout = pools.http.get(f"/v1/jobs/{task}/logs").json()["stdout"].strip()
        assert stdout == f"index={index} of={array['id']}"


def test_explain_says_why_a_job_is_pending(pools: Cluster) -> None:
    blockers = [
        pools.submit(gpus=2, gpu_model=["H100-80GB"], command=["sleep", "20"], time_limit_s=60)
    ]
    pools.wait_state(blockers, "running", timeout=30)
    waiting = pools.submit(gpus=1, gpu_model=["H100-80GB"], command=["true"])
    deadline = time.monotonic() + 20
    while (answer := pools.http.get(f"/v1/jobs/{waiting}/explain").json())["state"] != "queued":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert answer["reason"] == "Resources"
    assert answer["nodes"]["node-a"].startswith("model: no H100-80GB")
    assert answer["nodes"]["node-b"].startswith("busy")
    assert answer["estimated_start"] is not None
    assert pools.http.get("/v1/jobs/no-such-job/explain").status_code == 404
    for job_id in [*blockers, waiting]:
        pools.http.delete(f"/v1/jobs/{job_id}")
    pools.wait_final([*blockers, waiting], timeout=30)


def test_the_queue_lists_pending_jobs_in_order_with_their_factors(pools: Cluster) -> None:
    blocker = pools.submit(gpus=2, gpu_model=["H100-80GB"], command=["sleep", "20"])
    pools.wait_state([blocker], "running", timeout=30)
    low = pools.submit(gpus=1, gpu_model=["H100-80GB"], command=["true"], priority=1)
    high = pools.submit(gpus=1, gpu_model=["H100-80GB"], command=["true"], priority=9)
    deadline = time.monotonic() + 20
    while True:
        queue = pools.http.get("/v1/queue").json()
        ids = [job["id"] for job in queue["jobs"]]
        if low in ids and high in ids:
            break
        assert time.monotonic() < deadline, queue
        time.sleep(0.2)
    assert ids.index(high) < ids.index(low)
    first = queue["jobs"][ids.index(high)]
    assert first["priority"] == 9 and first["points"] == 9.0  # default weights: plain priority
    assert queue["weights"]["age"] == 0
    for job_id in [blocker, low, high]:
        pools.http.delete(f"/v1/jobs/{job_id}")
    pools.wait_final([blocker, low, high], timeout=30)


def test_admins_create_accounts_and_set_shares(pools: Cluster) -> None:
    created = pools.http.post("/v1/accounts", json={"name": "org"})
    assert created.status_code == 201, created.text
    team = pools.http.post("/v1/accounts", json={"name": "team-a", "parent": "org", "shares": 3})
    assert team.status_code == 201, team.text
    assert pools.http.post("/v1/accounts", json={"name": "org"}).status_code == 409
    orphan = pools.http.post("/v1/accounts", json={"name": "x", "parent": "nowhere"})
    assert orphan.status_code == 404
    assert pools.http.post("/v1/accounts", json={"name": "bad name"}).status_code == 422
    shares = pools.http.put("/v1/accounts/team-a/shares", json={"shares": 5})
    assert shares.status_code == 200 and shares.json()["shares"] == 5
    assert pools.http.put("/v1/accounts/ghost/shares", json={"shares": 1}).status_code == 404
    listed = {a["name"]: a for a in pools.http.get("/v1/accounts").json()["accounts"]}
    assert listed["team-a"] == {
        "name": "team-a",
        "parent": "org",
        "shares": 5,
        "description": "",
        "quota": None,
        "quotas": [],
        "users": [],
        "coordinators": [],
    }
    members = pools.http.put("/v1/accounts/team-a/users", json={"users": ["carol", "alice"]})
    assert members.status_code == 200 and members.json()["users"] == ["alice", "carol"]
    assert pools.http.put("/v1/accounts/ghost/users", json={"users": []}).status_code == 404
    outsider = pools.submit(account="team-a", user="mallory", gpus=0, command=["true"])
    member = pools.submit(account="team-a", user="carol", gpus=0, command=["true"])
    done = pools.wait_final([outsider, member], timeout=30)
    assert done[outsider]["state"] == "rejected"
    assert done[outsider]["reason"] == "user mallory may not submit under account team-a"
    assert done[member]["state"] == "succeeded"
    assert listed["org"]["parent"] is None


def test_a_quota_holds_jobs_until_its_account_has_room(pools: Cluster) -> None:
    pools.http.post("/v1/accounts", json={"name": "capped"})
    quota = pools.http.put("/v1/accounts/capped/quota", json={"nominal": 1000})
    assert quota.status_code == 200 and quota.json()["quota"]["nominal"] == 1000
    first = pools.submit(gpus=1, account="capped", command=["sleep", "2"], gpu_model=["A100-80GB"])
    second = pools.submit(gpus=1, account="capped", command=["true"], gpu_model=["A100-80GB"])
    pools.wait_state([first], "running", timeout=30)
    deadline = time.monotonic() + 10
    while (answer := pools.http.get(f"/v1/jobs/{second}/explain").json())["state"] != "queued":
        assert time.monotonic() < deadline
        time.sleep(0.2)
    assert answer["reason"] == "QuotaExceeded", answer
    done = pools.wait_final([first, second], timeout=60)
    assert done[second]["state"] == "succeeded"
    assert done[second]["started_at"] >= done[first]["finished_at"]
    assert pools.http.put("/v1/accounts/ghost/quota", json={"nominal": 1}).status_code == 404
    bad = pools.http.put("/v1/accounts/capped/quota", json={"resource": "disk", "nominal": 1})
    assert bad.status_code == 422

    # a quota of one GPU model: the H100 job waits with the reason, then runs once lifted
    h100 = {"resource": "model:H100-80GB", "nominal": 500}
    limited = pools.http.put("/v1/accounts/capped/quota", json=h100)
    assert limited.status_code == 200, limited.text
    assert [q["resource"] for q in limited.json()["quotas"]] == ["gpu_milli", "model:H100-80GB"]
    job = pools.submit(
        gpus=1, gpu_milli=600, gpu_model=["H100-80GB"], account="capped", command=["true"]
    )
    deadline = time.monotonic() + 10
    while (answer := pools.http.get(f"/v1/jobs/{job}/explain").json())["reason"] != (
        "QuotaExceeded"
    ):
        assert time.monotonic() < deadline, answer
        time.sleep(0.2)
    assert "model:H100-80GB" in answer["detail"]
    # the row follows the fold a batch later: its reason once it shows the job queued
    while not str((row := pools.job(job))["reason"]).startswith("QuotaExceeded:"):
        assert time.monotonic() < deadline + 10, row
        time.sleep(0.2)
    lifted = pools.http.put("/v1/accounts/capped/quota", json={**h100, "nominal": None})
    assert [q["resource"] for q in lifted.json()["quotas"]] == ["gpu_milli"]
    assert pools.wait_final([job], timeout=30)[job]["state"] == "succeeded"

"""Make a golden log: run the real stack through a day in the life of a cluster and
archive the log it wrote, with what the fold of that day's code says of it.

A golden log is made once, by the version of its date, and then never changes: every
later version must fold it to the same figures and re-make every decision in it
(tests/unit/state/test_golden_log.py). Make a new one (a new folder) when events are
added, so that the new ones are pinned too; never remake an old one.

    .venv/bin/python tests/golden/make_golden_log.py tests/golden/log-YYYY-MM-DD

It starts nats-server, the six services and two agents (SQLite, in a temp folder),
plays the scenario below over REST, waits until everything has ended and been
charged, exports the stream with `gpuloom.bus.archive.export` (segments with their
sha256) and writes `expected.json` from the fold of the archive.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from gpuloom.auth import OPERATOR
from gpuloom.bus.archive import export
from gpuloom.bus.jetstream import EventBus
from gpuloom.events import array_task_id
from gpuloom.state import ClusterState, fold
from gpuloom.testing.cluster import Cluster, SimNode
from gpuloom.testing.golden import expected_of, read_golden
from gpuloom.testing.servers import nats_jetstream

NODES = {
    "agent-a": [SimNode("node-a", "A100-80GB", 4)],
    "agent-b": [SimNode("node-b", "H100-80GB", 2)],
}
ENV = {
    "GPULOOM_PRIORITY_WEIGHT_FAIR_SHARE": "10000",
    "GPULOOM_PRIORITY_WEIGHT_AGE": "100",
    "GPULOOM_CHARGE_INTERVAL_S": "1",
}


def ok(answer: httpx.Response) -> httpx.Response:
    assert answer.is_success, (answer.request.method, answer.request.url, answer.text)
    return answer


def scenario(cluster: Cluster) -> list[str]:
    """Every kind of event the services write today; the jobs it submitted."""
    ops = cluster.client_for("ops", [OPERATOR])
    alice, bob = cluster.client_for("alice"), cluster.client_for("bob")
    ok(ops.post("/v1/accounts", json={"name": "lab", "shares": 2}))
    ok(ops.post("/v1/accounts", json={"name": "vision", "parent": "lab", "shares": 1}))
    ok(ops.post("/v1/accounts", json={"name": "speech", "parent": "lab", "shares": 1}))
    ok(ops.put("/v1/accounts/vision/users", json={"users": ["alice", "bob"]}))
    ok(ops.put("/v1/accounts/speech/users", json={"users": ["bob"]}))
    ok(ops.put("/v1/accounts/vision/coordinators", json={"coordinators": ["carol"]}))
    ok(ops.put("/v1/accounts/speech/shares", json={"shares": 2}))
    ok(ops.put("/v1/accounts/speech/quota", json={"nominal": 4000, "borrowing_limit": 2000}))
    ok(ops.put("/v1/priority-classes/urgent", json={"priority": 1000, "may_preempt": True}))
    ok(ops.put("/v1/priority-classes/scratch", json={"priority": -10}))
    ok(ops.delete("/v1/priority-classes/scratch"))
    ok(ops.put("/v1/limits/user/bob", json={"max_gpus": 6}))
    ok(ops.post("/v1/nodes/node-a/gpus/3/pool", json={"pool": "vgpu"}))
    ok(ops.post("/v1/nodes/node-b/cordon", json={"reason": "firmware"}))
    ok(ops.delete("/v1/nodes/node-b/cordon"))

    def submit(client: httpx.Client, **job: object) -> str:
        body = {"name": "job", "account": "vision", "gpus": 1, "command": ["true"], **job}
        answer = client.post("/v1/jobs", json=body)
        assert answer.status_code == 202, answer.text
        return str(answer.json()["id"])

    jobs = [
        submit(alice, name="ok", command=["sleep", "1"]),
        submit(alice, name="fails", command=["sh", "-c", "exit 3"]),
        submit(bob, name="half", account="speech", gpu_milli=500, pool="vgpu"),
        submit(bob, name="gang", account="speech", replicas=2, gpus=1, command=["sleep", "1"]),
        submit(alice, name="limited", time_limit_s=1, command=["sleep", "30"]),
    ]
    # the gateway refuses at once what no node could ever run (logs before 2026-12-05
    # have admission's JobRejected for it)
    too_big = alice.post("/v1/jobs", json={**_job("too-big"), "gpus": 16})
    assert too_big.status_code == 422, too_big.text
    array = ok(alice.post("/v1/jobs", json={**_job("arr"), "array": 3})).json()["id"]
    jobs += [array_task_id(array, i) for i in range(3)]
    first = submit(alice, name="first", command=["sleep", "2"])
    jobs += [first, submit(alice, name="then", depends_on=[{"job": first}])]
    victim = submit(
        bob, name="victim", account="speech", gpus=4, gpu_model=["A100-80GB"],
        preemptible=True, command=["sleep", "6"],
    )  # fmt: skip
    jobs.append(victim)
    cluster.wait_state([victim], "running", timeout=60)
    jobs.append(
        submit(alice, name="urgent", gpus=2, gpu_model=["A100-80GB"], priority_class="urgent")
    )
    cancelled = submit(alice, name="cancel-me", command=["sleep", "60"])
    cluster.wait_state([cancelled], "running", timeout=60)
    ok(alice.delete(f"/v1/jobs/{cancelled}"))
    jobs.append(cancelled)
    # a big job reserves the A100s; short ones backfill around it, a queued one is cancelled
    long_one = submit(bob, name="long", gpus=2, gpu_model=["A100-80GB"], command=["sleep", "4"])
    cluster.wait_state([long_one], "running", timeout=60)
    head = submit(alice, name="head", gpus=4, gpu_model=["A100-80GB"], time_limit_s=30)
    short = submit(bob, name="short", account="speech", gpus=1, time_limit_s=2)
    queued = submit(alice, name="never-runs", gpus=4, gpu_model=["A100-80GB"], priority=-5)
    ok(alice.delete(f"/v1/jobs/{queued}"))
    jobs += [long_one, head, short, queued]
    for client in (ops, alice, bob):
        client.close()
    return jobs


def _job(name: str) -> dict[str, object]:
    return {"name": name, "account": "vision", "gpus": 1, "command": ["true"]}


def wait_all_charged(cluster: Cluster, jobs: list[str], timeout: float = 180) -> None:
    cluster.wait_final(jobs, timeout=timeout)
    deadline = time.monotonic() + timeout
    while True:
        state = read_state(cluster)
        live = [j for j in jobs if j in state.jobs]
        if not live:
            return
        assert time.monotonic() < deadline, f"still in the live state: {live}"
        time.sleep(1)


def read_state(cluster: Cluster) -> ClusterState:
    return fold(cluster.read_log())


def lose_and_recover(cluster: Cluster, node: str, agent: str) -> None:
    """kill -9 of an agent: inventory declares its node lost, then it comes back."""
    assert cluster.stack is not None
    cluster.stack.kill(agent, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while read_state(cluster).nodes[node].phase != "lost":
        assert time.monotonic() < deadline, f"{node} was never declared lost"
        time.sleep(0.5)
    cluster.stack.restart(agent)
    cluster.wait_nodes_ready(2, timeout=60)


def record_audit(cluster: Cluster) -> None:
    """`gpuloom audit` as an operator runs it: it writes its AuditCompleted."""
    command = [str(Path(sys.executable).parent / "gpuloom"), "audit", "--nats", cluster.nats_url]
    subprocess.run(command, check=True, timeout=120)


async def archive(nats_url: str, root: Path) -> None:
    bus = await EventBus.connect(nats_url, "GPULOOM", name="golden", create=False)
    try:
        await export(bus, root)
    finally:
        await bus.close()


def main() -> None:
    target = Path(sys.argv[1])
    if target.exists():
        raise SystemExit(f"{target} exists: a golden log is never remade")
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        with nats_jetstream(base / "nats") as url:
            cluster = Cluster(
                url, f"sqlite+aiosqlite:///{base}/gpuloom.db", base / "data", NODES, ENV
            )
            try:
                cluster.start()
                cluster.wait_nodes_ready(2)
                jobs = scenario(cluster)
                wait_all_charged(cluster, jobs)
                lose_and_recover(cluster, "node-b", "agent-b")
                record_audit(cluster)
                report = cluster.assert_audit_passes()
                print(f"audit: {report.verified} decisions re-made")
            finally:
                cluster.stop()
            asyncio.run(archive(url, target))
    records = read_golden(target)
    expected = expected_of(records)
    (target / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")
    print(f"{target}: {len(records)} events; {json.dumps(expected['events'])}")


if __name__ == "__main__":
    main()

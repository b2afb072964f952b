"""Distributed-training gangs with the real services: the replicas meet at the
rendezvous replica 0's agent reserved, through the variables every launcher reads
(a TCP rendezvous in the style of torch.distributed's store, no GPU needed); `show`
and `logs` report every replica; one failed replica ends the gang.

Two simulated nodes of two A100s, each served by its own agent process."""

from __future__ import annotations

import json
import textwrap
import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from gpuloom.client.cli import app
from gpuloom.testing.cluster import Cluster, SimNode, simulated_cluster

NODES = {
    "agent-a": [SimNode("node-a", "A100-80GB", 2)],
    "agent-b": [SimNode("node-b", "A100-80GB", 2)],
}

#: Each replica opens the rendezvous from the launcher variables alone: rank 0 listens
#: on MASTER_PORT, the others connect to MASTER_ADDR and say their rank; rank 0 answers
#: once all WORLD_SIZE have, and every rank prints what it saw.
RENDEZVOUS = textwrap.dedent(
    """
    import json, os, socket, time
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    address, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    names = ("MASTER_ADDR", "MASTER_PORT", "WORLD_SIZE", "RANK", "LOCAL_RANK", "NODE_RANK",
             "PET_NNODES", "PET_NODE_RANK", "PET_NPROC_PER_NODE", "CUDA_VISIBLE_DEVICES")
    print("ENV " + json.dumps({name: os.environ.get(name) for name in names}), flush=True)
    if rank == 0:
        server = socket.create_server(("0.0.0.0", port))
        server.settimeout(60)
        peers = {}
        while len(peers) < world - 1:
            conn, _ = server.accept()
            peers[int(conn.recv(16))] = conn
        for conn in peers.values():
            conn.sendall(b"go")
            conn.close()
        print(f"rank 0 of {world} met ranks {sorted(peers)}", flush=True)
    else:
        deadline = time.monotonic() + 60
        while True:
            try:
                conn = socket.create_connection((address, port), timeout=5)
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        conn.sendall(str(rank).encode())
        print(f"rank {rank} of {world} got {conn.recv(16).decode()}", flush=True)
    """
)


@pytest.fixture(scope="module")
def gangs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with simulated_cluster(tmp_path_factory.mktemp("gangs"), NODES) as cluster:
        yield cluster


def logs_of(cluster: Cluster, job_id: str, replica: int) -> str:
    answer = cluster.http.get(f"/v1/jobs/{job_id}/logs", params={"replica": replica})
    assert answer.status_code == 200, answer.text
    assert answer.json()["replica"] == replica
    return str(answer.json()["stdout"])


def env_of(stdout: str) -> dict[str, str]:
    line = next(line for line in stdout.splitlines() if line.startswith("ENV "))
    return dict(json.loads(line[4:]))


def test_a_gang_of_two_meets_at_its_master(gangs: Cluster) -> None:
    # the system's python, the script in argv: jobs run as an unprivileged account,
    # which may not read the test's virtualenv or temporary folders
    job_id = gangs.submit(gpus=2, replicas=2, command=["python3", "-c", RENDEZVOUS])
    job = gangs.wait_final([job_id], timeout=90)[job_id]
    assert job["state"] == "succeeded", (job, logs_of(gangs, job_id, 0))

    first, second = logs_of(gangs, job_id, 0), logs_of(gangs, job_id, 1)
    assert "rank 0 of 2 met ranks [1]" in first
    assert "rank 1 of 2 got go" in second
    env0, env1 = env_of(first), env_of(second)
    assert env0["MASTER_ADDR"] == env1["MASTER_ADDR"]
    assert env0["MASTER_PORT"] == env1["MASTER_PORT"] and 29500 <= int(env0["MASTER_PORT"]) < 30000
    assert (env0["RANK"], env1["RANK"], env1["WORLD_SIZE"], env1["NODE_RANK"]) == (
        "0",
        "1",
        "2",
        "1",
    )
    assert env0["LOCAL_RANK"] == env1["LOCAL_RANK"] == "0"
    assert env1["PET_NNODES"] == "2" and env1["PET_NPROC_PER_NODE"] == "2"
    assert env0["CUDA_VISIBLE_DEVICES"] == env1["CUDA_VISIBLE_DEVICES"] == "0,1"

    placement = job["placement"]
    assert [(r["replica"], r["state"], r["exit_code"]) for r in placement] == [
        (0, "succeeded", 0),
        (1, "succeeded", 0),
    ]
    assert {r["host"] for r in placement} == {"node-a", "node-b"}
    started = [
        e["data"] for e in gangs.http.get(f"/v1/jobs/{job_id}/events").json()["events"]
        if e["type"] == "JobStarted"
    ]  # fmt: skip
    master = next(s for s in started if s["replica"] == 0)
    assert (master["master_addr"], str(master["master_port"])) == (
        env0["MASTER_ADDR"], env0["MASTER_PORT"],
    )  # fmt: skip


def test_one_failed_replica_ends_the_gang(gangs: Cluster) -> None:
    crash = ["sh", "-c", 'if [ "$RANK" = 1 ]; then exit 3; fi; exec sleep 300']
    begun = time.monotonic()
    job_id = gangs.submit(gpus=1, replicas=2, command=crash)
    job = gangs.wait_final([job_id], timeout=60)[job_id]
    assert job["state"] == "failed", job
    assert time.monotonic() - begun < 45, "replica 0 was stopped, not left to sleep"
    by_replica = {r["replica"]: r for r in job["placement"]}
    assert (by_replica[1]["state"], by_replica[1]["exit_code"]) == ("failed", 3)
    assert by_replica[0]["state"] == "failed"
    assert by_replica[0]["reason"] == "replica 1 failed with exit code 3: the gang ends"


def test_show_and_logs_report_every_replica(gangs: Cluster) -> None:
    say = ["sh", "-c", 'echo "replica $RANK of $WORLD_SIZE"']
    job_id = gangs.submit(gpus=1, replicas=2, command=say)
    job = gangs.wait_final([job_id], timeout=60)[job_id]
    assert job["state"] == "succeeded"
    hosts = [replica["host"] for replica in job["placement"]]
    env = {"GPULOOM_TOKEN": gangs.token_for("alice"), "GPULOOM_GATEWAY_URL": gangs.gateway_url}
    runner = CliRunner()

    shown = runner.invoke(app, ["show", job_id], env=env)
    assert shown.exit_code == 0, shown.output
    table = shown.stdout[shown.stdout.index("replicas") :]
    rows = [line.split() for line in table.splitlines() if line.split()[:1] in (["0"], ["1"])]
    assert [row[:2] for row in rows] == [["0", hosts[0]], ["1", hosts[1]]], table
    assert all("succeeded" in row for row in rows), table

    one = runner.invoke(app, ["logs", job_id, "--replica", "1"], env=env)
    assert one.exit_code == 0, one.output
    assert one.stdout == "replica 1 of 2\n"

    every = runner.invoke(app, ["logs", job_id, "--all"], env=env)
    assert every.exit_code == 0, every.output
    assert "==> attempt 1, replica 0" in every.stdout and "replica 0 of 2" in every.stdout
    assert "==> attempt 1, replica 1" in every.stdout and "replica 1 of 2" in every.stdout

    missing = gangs.http.get(f"/v1/jobs/{job_id}/logs", params={"replica": 5})
    assert missing.status_code == 404 and "has 2 replica(s)" in missing.text
    no_attempt = gangs.http.get(f"/v1/jobs/{job_id}/logs", params={"attempt": 9})
    assert no_attempt.status_code == 404 and "no attempt 9" in no_attempt.text

"""Slurm habits in the CLI, end to end: arrays, dependencies in sbatch's syntax,
`--wait` over every task, the REASON column, a request no node could ever run
refused at once, and `nodes remove` for a node gone for good (the last test: it
kills node-b's agent)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from typer.testing import CliRunner

from gpuloom.client.cli import app
from gpuloom.testing.cluster import Cluster, SimNode, simulated_cluster

NODES = {
    "agent-a": [
        SimNode(
            "node-a",
            "A100-80GB",
            2,
            labels=(("zone", "a"),),
            topology=(("nvlink", "nvl-a"), ("rack", "r1")),
        )
    ],
    "agent-b": [SimNode("node-b", "A100-80GB", 1, topology=(("nvlink", "nvl-b"), ("rack", "r2")))],
}


@pytest.fixture(scope="module")
def habits(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with simulated_cluster(tmp_path_factory.mktemp("habits"), NODES) as cluster:
        yield cluster


def gpuloom(cluster: Cluster, *args: str, roles: tuple[str, ...] = ()) -> tuple[int, str, str]:
    token = cluster.token_for("alice", roles)
    env = {"GPULOOM_TOKEN": token, "GPULOOM_GATEWAY_URL": cluster.gateway_url}
    result = CliRunner().invoke(app, list(args), env=env)
    return result.exit_code, result.stdout, result.stderr


def test_nodes_say_and_show_their_place_in_the_topology(habits: Cluster) -> None:
    nodes = {n["name"]: n for n in habits.http.get("/v1/nodes").json()["nodes"]}
    assert list(nodes["node-a"]["topology"].items()) == [("nvlink", "nvl-a"), ("rack", "r1")]
    code, out, err = gpuloom(habits, "nodes")
    assert code == 0, err
    assert "TOPOLOGY (rack/nvlink)" in out and "r1/nvl-a" in out and "r2/nvl-b" in out, out


def test_a_required_rack_gang_waits_on_split_room_then_starts_inside_one_rack(
    habits: Cluster,
) -> None:
    """node-a (2 GPUs) is rack r1, node-b (1 GPU) rack r2: with one GPU of node-a busy,
    two GPUs are free, one per rack, and a gang that must be inside one rack waits,
    saying so; once node-a is free again it starts there."""
    busy = habits.submit(gpus=1, command=["sleep", "120"], node_selector={"zone": "a"})
    habits.wait_state([busy], "running")
    code, out, err = gpuloom(
        habits, "submit", "--account", "research", "--gpus", "1", "--replicas", "2",
        "--topology", "rack", "--", "sleep", "1",
    )  # fmt: skip
    assert code == 0, err
    gang = out.strip()
    deadline = time.monotonic() + 20
    while "Topology" not in str((job := habits.job(gang)).get("reason")):
        assert time.monotonic() < deadline, {k: job.get(k) for k in ("state", "reason")}
        time.sleep(0.2)
    assert job["state"] == "queued"
    assert "no rack has 2 free GPU(s) for it: r1 has 1, r2 has 1" in job["reason"], job
    assert habits.http.delete(f"/v1/jobs/{busy}").status_code == 202
    done = habits.wait_final([gang], timeout=90)
    assert done[gang]["state"] == "succeeded", done[gang]
    hosts = {r["host"] for r in habits.job(gang)["placement"]}
    assert hosts == {"node-a"}, hosts

    code, _, err = gpuloom(
        habits, "submit", "--account", "research", "--topology", "block", "--", "true"
    )
    assert code != 0 and "topology.level" in err and "nvlink, rack" in err, err


def test_a_preferred_gang_spreads_only_when_it_must(habits: Cluster) -> None:
    """A gang that prefers one rack stays inside r1 while r1 has room for it (two
    replicas on node-a, though node-b is free too), and spreads over both racks only
    when no rack has room for all of it (three replicas, three GPUs in two racks)."""

    def run(replicas: int) -> set[str]:
        code, out, err = gpuloom(
            habits, "submit", "--account", "research", "--gpus", "1", "--replicas",
            str(replicas), "--topology-preferred", "rack", "--", "sleep", "1",
        )  # fmt: skip
        assert code == 0, err
        gang = out.strip()
        done = habits.wait_final([gang], timeout=90)
        assert done[gang]["state"] == "succeeded", done[gang]
        return {r["host"] for r in habits.job(gang)["placement"]}

    assert run(2) == {"node-a"}, "r1 has room for both: the gang stays inside it"
    assert run(3) == {"node-a", "node-b"}, "no rack has 3: it spreads, over few"


def test_jobs_lists_the_newest_first_a_page_at_a_time_or_all(habits: Cluster) -> None:
    """The job just submitted is on the first page however many came before (squeue's
    and kubectl's users look for it there); `--oldest` is submission order; `--all`
    lists every one."""
    mine = [habits.submit(gpus=0, command=["true"], name=f"page-{n}") for n in range(3)]
    habits.wait_final(mine)
    code, out, err = gpuloom(habits, "jobs", "--limit", "2", "--json")
    assert code == 0, err
    page = json.loads(out)
    assert [job["id"] for job in page["jobs"]] == [mine[2], mine[1]]
    code, out, _ = gpuloom(habits, "jobs", "--limit", "2")
    assert "newest first (--offset 2 for the next, --all for every one)" in " ".join(out.split())
    code, out, _ = gpuloom(habits, "jobs", "--oldest", "--limit", "1", "--json")
    assert json.loads(out)["jobs"][0]["id"] not in mine[1:], "the first job ever, not these"
    code, out, _ = gpuloom(habits, "jobs", "--all", "--json")
    listed = json.loads(out)
    assert len(listed["jobs"]) == listed["total"] and set(mine) <= {j["id"] for j in listed["jobs"]}


def test_an_array_waited_for_task_by_task(habits: Cluster) -> None:
    code, out, err = gpuloom(
        habits, "submit", "--account", "research", "--array", "3", "--wait", "--",
        "sh", "-c", 'test "$GPULOOM_ARRAY_INDEX" != 1',
    )  # fmt: skip
    array_id = out.splitlines()[0]
    assert code == 1, (out, err)  # task 1 fails: --wait says so and exits 1
    assert f"{array_id}-1 ended failed" in err
    assert f"{array_id}-0 ended" not in err and f"{array_id}-2 ended" not in err
    code, out, err = gpuloom(habits, "logs", array_id, "--stderr")  # each task's, by index
    assert code == 0, err
    headers = [line for line in out.splitlines() if line.startswith("==> task")]
    assert [h.split(",")[0] for h in headers] == [f"==> task {array_id}-{i}" for i in range(3)]


def test_a_dependency_in_sbatch_syntax_orders_jobs(habits: Cluster) -> None:
    code, out, _ = gpuloom(habits, "submit", "--account", "research", "--", "sleep", "2")
    assert code == 0
    first = out.strip()
    code, out, err = gpuloom(
        habits, "submit", "--account", "research", "--dependency", f"afterok:{first}", "--",
        "true",
    )  # fmt: skip
    assert code == 0, err
    second = out.strip()
    code, listed, _ = gpuloom(habits, "jobs", "--limit", "500")
    assert code == 0
    row = next(line for line in listed.splitlines() if second[:12] in line)
    assert "REASON" in listed and "Dependency" in row, listed
    assert row.count("Dependency") == 1  # said once, not "Dependency: Dependency: ..."
    done = habits.wait_final([first, second], timeout=60)
    assert done[first]["finished_at"] <= done[second]["started_at"]

    code, _, err = gpuloom(
        habits, "submit", "--account", "research", "--dependency", f"afternotok:{first}", "--",
        "true",
    )  # fmt: skip
    assert code == 2 and "afternotok" in err and "afterok, afterany" in err


def test_a_job_no_node_could_ever_run_is_refused_at_once(habits: Cluster) -> None:
    code, out, err = gpuloom(habits, "submit", "--account", "research", "--gpus", "3", "--", "true")
    assert code != 0 and out == ""
    assert "422" in err or "largest node has 2" in err, err
    assert "largest node has 2" in err


def test_a_node_gone_for_good_is_removed_by_an_operator(habits: Cluster) -> None:
    busy = habits.submit(gpus=2, command=["sleep", "60"])  # holds node-a
    habits.wait_state([busy], "running")
    code, _, err = gpuloom(habits, "nodes", "remove", "node-a", roles=("operator",))
    assert code == 1 and "still holds job(s)" in err and busy in err, err

    assert habits.stack is not None
    habits.stack.kill("agent-b")  # node-b's machine is gone
    deadline = time.monotonic() + 30
    while (
        next(n for n in habits.http.get("/v1/nodes").json()["nodes"] if n["name"] == "node-b")[
            "state"
        ]
        != "lost"
    ):
        assert time.monotonic() < deadline, "node-b was not lost"
        time.sleep(0.25)

    code, _, err = gpuloom(habits, "nodes", "remove", "node-b")  # a plain user
    assert code == 1 and "operator" in err, err
    code, out, err = gpuloom(
        habits, "nodes", "remove", "node-b", "--reason", "decommissioned", roles=("operator",)
    )
    assert code == 0, err
    assert "node-b removed" in out
    # another caller's read: it waits for its own writes only, so the row goes a moment later
    deadline = time.monotonic() + 10
    while (names := [n["name"] for n in habits.http.get("/v1/nodes").json()["nodes"]]) != [
        "node-a"
    ]:
        assert time.monotonic() < deadline, names
        time.sleep(0.1)
    removed = [r for r in habits.read_log() if r.event.TYPE == "NodeRemoved"]
    assert [(r.event.node, r.event.reason, r.envelope.principal) for r in removed] == [
        ("node-b", "decommissioned", "alice")
    ]
    again = habits.http.delete("/v1/nodes/node-b", headers=operator_headers(habits))
    assert again.status_code == 404
    habits.http.delete(f"/v1/jobs/{busy}")


def operator_headers(cluster: Cluster) -> dict[str, str]:
    return {"Authorization": f"Bearer {cluster.token_for('root', ('operator',))}"}

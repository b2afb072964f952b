"""`gpuloom audit` proves the services' snapshots and catches a forged one; `gpuloom
replay` starts from a snapshot: real services, real nats-server, the CLI as an
operator runs it (the admin's NATS URL)."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from restart_helpers import run_jobs
from typer.testing import CliRunner

from gpuloom.audit import state_at
from gpuloom.bus import EventBus
from gpuloom.bus.snapshots import SnapshotStore
from gpuloom.client.cli import app
from gpuloom.devstack import SERVICES, wait_http
from gpuloom.state import ClusterState
from gpuloom.state.snapshot import encode_snapshot
from gpuloom.testing.cluster import Cluster

pytestmark = pytest.mark.integration


def _forge(state: ClusterState) -> str:
    """Change one field of `state` as a forger would; the path an audit should name."""
    if state.jobs:
        job = sorted(state.jobs)[0]
        state.jobs[job] = dataclasses.replace(
            state.jobs[job], priority=state.jobs[job].priority + 7
        )
        return f"jobs['{job}'].priority"
    job = sorted(state.tombstones)[0]
    state.tombstones[job] = dataclasses.replace(state.tombstones[job], user="mallory")
    return f"tombstones['{job}'].user"


async def _plant(nats_url: str, data: bytes, seq: int) -> list[int]:
    bus = await EventBus.connect(nats_url, "GPULOOM", name="forger", create=False)
    try:
        store = SnapshotStore(bus.js, "placement", keep=10, create=True)
        await store.write(seq, data)
        return [s.seq for s in await store.stored()]
    finally:
        await bus.close()


def _json(result: Any) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(result.stdout)
    return doc


def test_audit_proves_snapshots_catches_a_forged_one_and_replay_starts_from_one(
    cluster: Cluster,
) -> None:
    stack = cluster.stack
    assert stack is not None
    run_jobs(cluster, 3, "before")
    stack.kill("placement", signal.SIGTERM)  # a clean stop stores the state it folded
    logs = (cluster.data_dir / "logs" / "placement.log").read_text(errors="replace")
    written = re.findall(r"wrote its snapshot at seq (\d+)", logs)
    assert written, logs[-2000:]
    seq = int(written[-1])
    stack.restart("placement")
    run_jobs(cluster, 2, "after")  # decisions after the snapshot
    runner = CliRunner()
    name = f"seq-{seq:015d}"

    passed = runner.invoke(app, ["audit", "--nats", cluster.nats_url])
    assert passed.exit_code == 0, passed.output
    assert "0 mismatches" in passed.output
    assert f"proved snapshot {name} of placement is the fold of the log up to seq {seq}" in (
        passed.output
    )
    report = _json(runner.invoke(app, ["audit", "--nats", cluster.nats_url, "--json"]))
    assert {(c["source"], c["seq"], c["outcome"]) for c in report["snapshots"]} >= {
        ("placement", seq, "proved")
    }
    assert not [c for c in report["snapshots"] if c["outcome"] == "differs"]
    # the command as an operator runs it, its work shared between two processes
    command = [str(Path(sys.executable).with_name("gpuloom")), "audit", "--nats"]
    shared = subprocess.run(
        [*command, cluster.nats_url, "--json", "--no-record", "--workers", "2"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert shared.returncode == 0, shared.stderr
    in_two = json.loads(shared.stdout)
    assert in_two["workers"] == 2
    assert (in_two["verified"], in_two["mismatches"]) == (report["verified"], [])
    assert ("placement", seq, "proved") in {
        (c["source"], c["seq"], c["outcome"]) for c in in_two["snapshots"]
    }

    recent = runner.invoke(
        app, ["audit", "--nats", cluster.nats_url, "--from-snapshot", "--no-record"]
    )
    assert recent.exit_code == 0, recent.output
    assert f"from the snapshot of placement at seq {seq}" in recent.output
    assert f"audited seqs {seq + 1}.." in recent.output
    assert "0 mismatches" in recent.output

    # a forged snapshot, well formed, under a sequence the log has: the audit names it
    forged_seq = seq - 1
    forged = state_at(cluster.read_log(), seq=forged_seq)
    assert forged.seq == forged_seq
    where = _forge(forged)
    assert forged_seq in asyncio.run(_plant(cluster.nats_url, encode_snapshot(forged), forged_seq))
    caught = runner.invoke(app, ["audit", "--nats", cluster.nats_url])
    assert caught.exit_code == 1, caught.output
    assert (
        f"snapshot seq-{forged_seq:015d} of placement is not the fold of the log up to seq "
        f"{forged_seq}: first difference in {where}"
    ) in " ".join(caught.output.split()), caught.output
    assert f"proved snapshot {name} of placement" in caught.output
    # the failure is recorded in the log (the gateway shows it once it has folded it)
    deadline = time.monotonic() + 15
    while (view := cluster.http.get("/v1/audit").json())["mismatch_count"] != 1:
        assert time.monotonic() < deadline, view
        time.sleep(0.2)
    assert view["mismatches"][0].startswith(f"snapshot seq-{forged_seq:015d} of placement")

    # replay: from the newest snapshot not past the point, or from seq 1 when asked
    at = seq + 2
    replay = runner.invoke(app, ["replay", "--nats", cluster.nats_url, "--at", str(at), "--json"])
    assert replay.exit_code == 0, replay.output
    assert f"replayed from the snapshot of placement at seq {seq}" in replay.output
    whole = runner.invoke(
        app, ["replay", "--nats", cluster.nats_url, "--at", str(at), "--json", "--from-start"]
    )
    assert whole.exit_code == 0, whole.output
    assert "replayed from seq 1" in whole.output
    assert _json(replay) == _json(whole)
    assert _json(replay)["seq"] == at


def test_audit_proves_the_snapshot_of_every_process(cluster: Cluster) -> None:
    """Every service folds every event with the one fold: the snapshot each stores at a
    clean stop (services, the gateway's projector) is the fold of the log. Agents keep
    none: they hold their nodes' view, not the log's fold."""
    stack = cluster.stack
    assert stack is not None
    run_jobs(cluster, 3, "before")
    for name in (*SERVICES, "agent-a", "agent-b"):
        stack.kill(name, signal.SIGTERM)
        stack.restart(name)
    wait_http(f"{cluster.gateway_url}/readyz", timeout=30)
    cluster.wait_nodes_ready(2)
    run_jobs(cluster, 2, "after")
    result = CliRunner().invoke(app, ["audit", "--nats", cluster.nats_url, "--json"])
    assert result.exit_code == 0, result.output
    report = _json(result)
    outcomes = {(c["source"].split(" ")[0], c["outcome"]) for c in report["snapshots"]}
    assert outcomes == {(name, "proved") for name in SERVICES}, report["snapshots"]

"""A node agent's faults against the real services: down while its job ends (charged to
the job's own end), cut off from the bus (it fences its jobs before the node is lost)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from urllib.parse import urlsplit

import pytest

from gpuloom.devstack import Stack
from gpuloom.events import JobFinished, NodeLost, UsageCharged
from gpuloom.testing.cluster import DEFAULT_NODES, Cluster, check_log, write_inventory

pytestmark = pytest.mark.integration

NODE = DEFAULT_NODES[0]  # node-a, 4 x A100-80GB


@contextlib.contextmanager
def one_node_cluster(
    nats_url: str, tmp_path: Path, env: Mapping[str, str], with_agent: bool = True
) -> Iterator[Cluster]:
    agents = {"agent-a": [NODE]} if with_agent else {}
    db = f"sqlite+aiosqlite:///{tmp_path}/gpuloom.db"
    cluster = Cluster(nats_url, db, tmp_path / "data", agents, env=env)
    try:
        cluster.start()
        yield cluster
        cluster.assert_audit_passes()
    finally:
        cluster.stop()
        for log in sorted((tmp_path / "data" / "logs").glob("agent*.log")):
            print(f"--- {log.name} (tail) ---\n{log.read_text(errors='replace')[-3000:]}")


def run_folder(cluster: Cluster, job_id: str, attempt: int = 1) -> Path:
    return cluster.data_dir / "agent" / NODE.name / job_id / str(attempt)


def wait_for(what: str, check: object, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# --- truthful charging ---------------------------------------------------------------


def test_a_job_that_ends_while_its_agent_is_down_is_charged_to_its_own_end(
    nats_url: str, tmp_path: Path
) -> None:
    # The agent stays away ~7 s: far less than the lost timeout, so nothing is requeued.
    with one_node_cluster(nats_url, tmp_path, {"GPULOOM_NODE_LOST_TIMEOUT_S": "60"}) as cluster:
        stack = cluster.stack
        assert stack is not None
        cluster.wait_nodes_ready(1)
        job_id = cluster.submit(gpus=2, command=["sleep", "2"])
        cluster.wait_state([job_id], "running", timeout=30)
        stack.kill("agent-a", signal.SIGTERM)  # the stack stops; the job goes on

        exit_file = run_folder(cluster, job_id) / "exit"
        wait_for("the job to end", exit_file.exists, timeout=15)
        time.sleep(5)
        assert cluster.job(job_id)["state"] == "running", "nobody has reported the end yet"
        stack.restart("agent-a")

        done = cluster.wait_final([job_id], timeout=60)[job_id]
        assert (done["state"], done["attempt"]) == ("succeeded", 1)
        charges: list[UsageCharged] = []

        def charged() -> bool:
            charges[:] = [
                r.event
                for r in cluster.read_log()
                if isinstance(r.event, UsageCharged) and r.event.job_id == job_id
            ]
            return bool(charges)

        wait_for("the charge", charged, timeout=30)

    finished = [
        r
        for r in cluster.read_log()
        if isinstance(r.event, JobFinished) and r.event.job_id == job_id
    ]
    [report] = finished
    assert isinstance(report.event, JobFinished) and report.event.ended_at is not None
    assert (report.envelope.at - report.event.ended_at).total_seconds() >= 5
    gpu_seconds = sum(c.gpu_milli_seconds for c in charges) / 1000
    # 2 GPUs x ~2 s; charging up to the report would be 2 x 7 s or more
    assert 2 * 1.5 <= gpu_seconds <= 2 * 3.0, gpu_seconds


# --- self-fencing --------------------------------------------------------------------


class Partition:
    """A TCP relay between one client and nats-server that can black-hole the traffic,
    as a partition does: the connections stay open, nothing gets through."""

    def __init__(self, upstream: str) -> None:
        parts = urlsplit(upstream)  # an admin URL carries user:password@
        assert parts.hostname is not None and parts.port is not None
        self.upstream = (parts.hostname, parts.port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"nats://127.0.0.1:{self.listener.getsockname()[1]}"
        self.cut = threading.Event()
        self.sockets: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.upstream)
            except OSError:
                return
            with self.lock:
                self.sockets += [client, server]
            for src, dst in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                if not self.cut.is_set():
                    dst.sendall(data)
        for sock in (src, dst):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)

    def heal(self) -> None:
        """Let traffic through again; the connections that lost bytes are closed (the
        client reconnects), as TCP connections do not survive a long partition."""
        with self.lock:
            dead, self.sockets = self.sockets, []
        for sock in dead:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
        self.cut.clear()

    def close(self) -> None:
        with contextlib.suppress(OSError):  # wakes the accepting thread, which then ends
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.heal()


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


def test_an_agent_cut_off_from_the_bus_stops_its_jobs_before_its_node_is_lost(
    nats_url: str, tmp_path: Path
) -> None:
    lost_after_s = 10.0  # the fence is half of it: seconds of margin on each side
    partition = Partition(nats_url)
    env = {"GPULOOM_NODE_LOST_TIMEOUT_S": str(lost_after_s)}
    with one_node_cluster(nats_url, tmp_path, env, with_agent=False) as cluster:
        assert cluster.stack is not None
        # agent-a reaches NATS through the partition; every other service directly
        agent = Stack(
            {**cluster.stack.env, "GPULOOM_NATS_URL": partition.url},
            cluster.stack.log_dir,
            server=cluster.stack.server,
        )
        inventory = write_inventory(cluster.data_dir / "agent-a.yaml", [NODE])
        agent.start("agent-a", "agent", ["--inventory", str(inventory)], nodes=[NODE.name])
        try:
            cluster.wait_nodes_ready(1)
            script = 'echo $$ > job.pid; [ "$GPULOOM_ATTEMPT" = 1 ] && exec sleep 300; exit 0'
            job_id = cluster.submit(gpus=1, command=["sh", "-c", script])
            cluster.wait_state([job_id], "running", timeout=30)
            pid_file = run_folder(cluster, job_id) / "work" / "job.pid"  # its cwd
            wait_for("the job's pid", lambda: pid_file.exists() and pid_file.read_text(), 10)
            pid = int(pid_file.read_text())

            partition.cut.set()
            cut_at = time.time()
            time.sleep(1.0)
            assert alive(pid), "not fenced before its time"
            wait_for("the fence", lambda: not alive(pid), timeout=lost_after_s - 1.5)
            killed_after = time.time() - cut_at
            nodes = {n["name"]: n["state"] for n in cluster.http.get("/v1/nodes").json()["nodes"]}
            assert nodes[NODE.name] == "ready", "killed before the node was declared lost"

            wait_for(
                "the node to be lost",
                lambda: cluster.job(job_id)["state"] == "queued",
                timeout=20,
            )
            partition.heal()
            done = cluster.wait_final([job_id], timeout=60)[job_id]
        finally:
            agent.stop()
            partition.close()

    assert (done["state"], done["attempt"]) == ("succeeded", 2), done
    assert 2.0 <= killed_after < lost_after_s
    records = cluster.read_log()
    [lost] = [r for r in records if isinstance(r.event, NodeLost)]
    exit_time = os.stat(run_folder(cluster, job_id) / "exit").st_mtime
    assert exit_time < lost.envelope.at.timestamp(), "the job was stopped before the requeue"
    finishes = [r.event for r in records if isinstance(r.event, JobFinished)]
    assert [(f.attempt, f.outcome) for f in finishes] == [(2, "succeeded")], (
        "the fenced attempt's end is not sent: the log had requeued it"
    )
    check = check_log(records)
    assert check.voided == [] and check.overlaps == []

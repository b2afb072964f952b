"""An elastic gang on the real stack (issue #40): it starts at its minimum where only
that fits, grows when GPUs free up, shrinks (instead of being stopped) for a job of a
higher class, and grows again; its replicas see each change through a rendezvous in
the style of torchrun's c10d store (stdlib only, no GPU needed), at the endpoint the
agent reserved. Each replica is charged for its own interval, no GPU runs two jobs at
once, and `gpuloom audit` re-makes every decision.

Two simulated nodes of two A100s, each served by its own agent process."""

from __future__ import annotations

import itertools
import socket
import textwrap
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest

from gpuloom.events import (
    JobFinished,
    JobGrown,
    JobPlaced,
    JobShrunk,
    JobStarted,
    Recorded,
    UsageCharged,
)
from gpuloom.testing.cluster import Cluster, SimNode, simulated_cluster, wait_for

pytestmark = pytest.mark.integration

NODES = {
    "agent-a": [SimNode("node-a", "A100-80GB", 2)],
    "agent-b": [SimNode("node-b", "A100-80GB", 2)],
}

#: Replica 0 serves the rendezvous at the endpoint its agent reserved (as torchrun's
#: c10d store does): each replica joins and holds its connection; a replica that is
#: stopped drops it. On every change replica 0 prints the members and tells them the
#: world's size. `finish` (from anyone) ends every replica with exit code 0.
RENDEZVOUS = textwrap.dedent(
    """
    import os, selectors, socket, sys, time
    me = int(os.environ["GPULOOM_REPLICA"])
    host, port = os.environ["GPULOOM_RENDEZVOUS"].rsplit(":", 1)
    print("ENV", os.environ["PET_NNODES"], os.environ["PET_RDZV_BACKEND"],
          os.environ["PET_RDZV_ENDPOINT"], os.environ.get("WORLD_SIZE"), flush=True)
    if me == 0:
        server = socket.create_server(("0.0.0.0", int(port)))
        pick = selectors.DefaultSelector()
        pick.register(server, selectors.EVENT_READ)
        members = {}  # connection -> replica number
        said = None
        while True:
            for key, _ in pick.select(timeout=1):
                if key.fileobj is server:
                    conn, _ = server.accept()
                    pick.register(conn, selectors.EVENT_READ)
                    members[conn] = None
                    continue
                conn = key.fileobj
                try:
                    data = conn.recv(64)
                except OSError:  # reset: a replica stopped with a message unread
                    data = b""
                if data.startswith(b"finish"):
                    for other in list(members):
                        try:
                            if members[other] is not None:
                                other.sendall(b"finish\\n")
                        except OSError:
                            pass
                    print("finished", flush=True)
                    sys.exit(0)
                if data.startswith(b"join"):
                    members[conn] = int(data.split()[1])
                    continue
                pick.unregister(conn)
                conn.close()
                members.pop(conn, None)
            world = sorted([0] + [n for n in members.values() if n is not None])
            if world != said:
                said = world
                print(f"world {len(world)}: {world}", flush=True)
                for conn, number in list(members.items()):
                    try:
                        if number is not None:
                            conn.sendall(f"world {len(world)}\\n".encode())
                    except OSError:  # it left; its end is read next round
                        pass
    deadline = time.monotonic() + 60
    while True:
        try:
            conn = socket.create_connection((host, int(port)), timeout=5)
            break
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    conn.sendall(f"join {me}".encode())
    conn.settimeout(None)
    for line in conn.makefile():
        print(f"replica {me} sees {line.strip()}", flush=True)
        if line.startswith("finish"):
            sys.exit(0)
    """
)


@pytest.fixture(scope="module")
def elastic(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with simulated_cluster(tmp_path_factory.mktemp("elastic"), NODES) as cluster:
        answer = cluster.http.put(
            "/v1/priority-classes/urgent", json={"priority": 100, "users": ["bob"]}
        )
        assert answer.status_code in (200, 201), answer.text
        yield cluster


class Gang:
    """The elastic job's sightings: its replica 0's log (the rendezvous's account)."""

    def __init__(self, cluster: Cluster, job_id: str) -> None:
        self.cluster, self.job_id = cluster, job_id

    def met(self, size: int, times: int = 1, timeout: float = 30) -> None:
        """Wait until replica 0 has said `times` times that the world is `size`."""
        try:
            wait_for(lambda: self.log().count(f"world {size}:") >= times, timeout, "")
        except TimeoutError:
            job = self.cluster.job(self.job_id)
            replicas = [(r["replica"], r["state"], r["reason"]) for r in job["placement"]]
            raise TimeoutError(
                f"the gang was not {size} for the {times} time: {job['state']} {replicas};"
                f" replica 0 said:\n{self.log()}"
            ) from None

    def log(self) -> str:
        return master_log(self.cluster, self.job_id)


def live(job: dict[str, Any]) -> list[int]:
    """The replicas of the job's placement that hold their GPUs."""
    return [r["replica"] for r in job["placement"] if r["state"] in ("placed", "running")]


def master_log(cluster: Cluster, job_id: str) -> str:
    answer = cluster.http.get(f"/v1/jobs/{job_id}/logs", params={"replica": 0})
    return str(answer.json().get("stdout", "")) if answer.status_code == 200 else ""


def test_an_elastic_gang_starts_at_its_minimum_grows_and_shrinks(elastic: Cluster) -> None:
    blocker = elastic.submit(gpus=2, command=["sleep", "600"])
    elastic.wait_state([blocker], "running")
    job_id = elastic.submit(
        gpus=1,
        replicas={"min": 2, "max": 4},
        preemptible=True,
        command=["python3", "-c", RENDEZVOUS],
    )
    elastic.wait_state([job_id], "running")

    gang = Gang(elastic, job_id)
    gang.met(2)
    assert len(live(elastic.job(job_id))) == 2, "only its minimum fits"
    assert "ENV 2:4 c10d" in master_log(elastic, job_id)

    # the blocker ends: the gang grows to its maximum, and the newcomers join it
    assert elastic.http.delete(f"/v1/jobs/{blocker}").status_code == 202
    gang.met(4)
    assert len(live(elastic.job(job_id))) == 4

    # a job of a higher class needs 2 GPUs of one node: the gang gives 2 replicas back
    urgent = elastic.submit(user="bob", gpus=2, priority_class="urgent", command=["sleep", "2"])
    gang.met(2, times=2)

    def left() -> list[dict[str, Any]]:
        return [r for r in elastic.job(job_id)["placement"] if r["state"] == "left"]

    gone = wait_for(left, 10, "the replicas told to leave never reported their end")
    assert len(gone) == 2 and all(r["replica"] != 0 for r in gone)
    shrunk = elastic.job(job_id)
    assert shrunk["state"] == "running" and len(live(shrunk)) == 2
    assert elastic.wait_final([urgent], timeout=60)[urgent]["state"] == "succeeded"

    # once it ended, the gang grows again, with new replicas
    gang.met(4, times=2)
    assert len(live(elastic.job(job_id))) == 4

    # the job ends as torchrun's would: every replica exits 0
    started = [e for e in events_of(elastic, job_id) if e["type"] == "JobStarted"]
    endpoint = next(e["data"] for e in started if e["data"]["replica"] == 0)
    with socket.create_connection((endpoint["master_addr"], endpoint["master_port"])) as conn:
        conn.sendall(b"finish")
    done = elastic.wait_final([job_id], timeout=60)[job_id]
    assert done["state"] == "succeeded", done
    final = elastic.job(job_id)
    states = sorted(r["state"] for r in final["placement"])
    assert states == ["left", "left", "succeeded", "succeeded", "succeeded", "succeeded"]
    replica_logs = elastic.http.get(
        f"/v1/jobs/{job_id}/logs", params={"replica": max(live_numbers(final))}
    ).json()["stdout"]
    assert "sees world 4" in replica_logs and "sees finish" in replica_logs

    records = elastic.read_log()
    mine = [r for r in records if getattr(r.event, "job_id", None) == job_id]
    kinds = [type(r.event) for r in mine]
    assert kinds.count(JobPlaced) == 1, "one attempt: it never stopped"
    assert kinds.count(JobGrown) >= 2 and kinds.count(JobShrunk) == 1
    placed = next(r.event for r in mine if isinstance(r.event, JobPlaced))
    assert len(placed.replicas) == 2, "it started at its minimum"
    assert no_gpu_ran_two_jobs(records) == []
    charged = sum(r.event.gpu_milli_seconds for r in mine if isinstance(r.event, UsageCharged))
    assert charged == pytest.approx(held_milli_seconds(mine), rel=0.001, abs=5)
    elastic.assert_audit_passes()


def test_a_bad_replica_range_is_refused_naming_the_field(elastic: Cluster) -> None:
    body = {"name": "j", "account": "research", "gpus": 1, "command": ["true"]}
    refused = elastic.http.post("/v1/jobs", json={**body, "replicas": {"min": 3, "max": 2}})
    assert refused.status_code == 422
    assert "replicas" in refused.text and "replicas.min (3) must be at most" in refused.text


def live_numbers(job: dict[str, Any]) -> list[int]:
    return [r["replica"] for r in job["placement"] if r["state"] != "left"]


def events_of(cluster: Cluster, job_id: str) -> list[dict[str, Any]]:
    answer = cluster.http.get(f"/v1/jobs/{job_id}/events")
    assert answer.status_code == 200, answer.text
    events: list[dict[str, Any]] = answer.json()["events"]
    return events


def no_gpu_ran_two_jobs(records: list[Recorded]) -> list[str]:
    """Each replica's process on each of its GPUs, from its JobStarted to its JobFinished
    (as the agents reported them): two jobs' processes on one GPU at once, if any."""
    hosts: dict[tuple[str, int], list[list[tuple[str, int]]]] = {}
    began: dict[tuple[str, int, int], float] = {}
    spans: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for record in records:
        event, at = record.event, record.envelope.at.timestamp()
        if isinstance(event, JobPlaced):
            hosts[(event.job_id, event.attempt)] = [
                [(p.node, p.index) for p in r.slices] for r in event.assignments()
            ]
        elif isinstance(event, JobGrown):
            gpus = [[(p.node, p.index) for p in r.slices] for r in event.replicas]
            hosts[(event.job_id, event.attempt)].extend(gpus)
        elif isinstance(event, JobStarted):
            began[(event.job_id, event.attempt, event.replica)] = at
        elif isinstance(event, JobFinished):
            start = began.pop((event.job_id, event.attempt, event.replica), None)
            if start is None:
                continue
            for gpu in hosts[(event.job_id, event.attempt)][event.replica]:
                spans.setdefault(gpu, []).append((start, at, event.job_id))
    overlaps = []
    for gpu, held in sorted(spans.items()):
        held.sort()
        for (_, end, first), (start, _, second) in itertools.pairwise(held):
            if start < end and first != second:
                overlaps.append(f"{gpu}: {first} and {second}")
    return overlaps


def held_milli_seconds(mine: list[Recorded]) -> float:
    """What the job held, integrated over the log's times: every replica from the run's
    start (or from the JobGrown that added it) to its end (a replica that left, its own
    JobFinished; the others, the run's, which is the last replica's report)."""
    start: datetime | None = None
    joined: dict[int, datetime] = {}
    ended: dict[int, datetime] = {}
    milli: dict[int, int] = {}
    for record in mine:
        event, at = record.event, record.envelope.at
        if isinstance(event, JobPlaced):
            for number, replica in enumerate(event.assignments()):
                milli[number] = sum(p.milli for p in replica.slices)
        elif isinstance(event, JobStarted) and start is None:
            start = at
        elif isinstance(event, JobGrown):
            for offset, replica in enumerate(event.replicas):
                milli[event.first + offset] = sum(p.milli for p in replica.slices)
                joined[event.first + offset] = at
        elif isinstance(event, JobFinished):
            ended[event.replica] = at
    assert start is not None
    shrunk = {n for r in mine if isinstance(r.event, JobShrunk) for n in r.event.replicas}
    end = max(at for number, at in ended.items() if number not in shrunk)
    total = 0.0
    for number, amount in milli.items():
        begin = joined.get(number, start)
        stop = ended[number] if number in shrunk else end
        total += amount * (stop - begin).total_seconds()
    return total

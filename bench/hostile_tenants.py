"""Another user's latency while one tenant attacks what all share (issue #36).

A real stack (NATS, SQLite, every service as its own process, 2 agents x 2 simulated
nodes x 8 GPUs). The victim, alice, makes the same probes in every scenario:

* `read`: `GET /v1/jobs?limit=20` (ms), the API path every dashboard and CLI takes;
* `run`: submit a one-GPU job (`true`) and see it succeed (s, from the POST until the
  gateway shows it succeeded: admission, queue, placement, the agent, the projection).

Scenarios, one after the other on the same stack, each attack started before the
probes and stopped after them (every loop bounded in count and time; loopback only):

  idle        nothing else
  slowloris   2,000 connections from 20 loopback addresses sending half a request,
              reopened as the gateway closes them
  streams     mallory asks for 200 event streams with 200 different filters, and keeps
              what she gets
  replays     mallory asks, again and again, for replays of the log from `after=0`
  arrays      mallory submits a batch of 1,000 arrays of 10,000 tasks (refused whole),
              then one array of `--array-size` tasks (10,000: her built-in most)
  webhooks    mallory registers her 20 webhooks (her most) at receivers that drip a
              byte a second and never finish

For each scenario it prints the median and p90 of each probe and the ratio of the
median to idle's (the issue's target: at most 2x), how many of mallory's tries were
refused, and where alice's jobs spent their time (the median from each step of the
log to the next, by the events' own timestamps).

  python bench/hostile_tenants.py [--probes N] [--scenarios idle,slowloris,...]
                                  [--attacker-account A] [--array-size N]
                                  [--env GPULOOM_SETTING=VALUE ...]

Alice submits under account `research`, mallory under `--attacker-account`
(`mallory-lab`: another tenant). Users take turns at equal priority by default
(`GPULOOM_QUEUE_FAIR_QUEUING`); `--env GPULOOM_QUEUE_FAIR_QUEUING=false` shows first in,
first out, where a job waits behind every task submitted before it. The filler's
tasks (a log for the replays to read) end before the first probe.
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx

from gpuloom.devstack import NatsServer
from gpuloom.state import FINAL_PHASES
from gpuloom.testing.cluster import Cluster, SimNode

SCENARIOS = ("idle", "slowloris", "streams", "replays", "arrays", "webhooks")
#: Mallory's account (`--attacker-account`): another tenant's, by default.
ACCOUNT = "mallory-lab"


def probe(alice: httpx.Client, count: int, jobs: list[str] | None = None) -> dict[str, list[float]]:
    """`count` rounds of alice's two probes (her jobs' ids appended to `jobs`)."""
    reads, runs = [], []
    answers: dict[int, int] = {}
    for _ in range(count):
        started = time.perf_counter()
        assert alice.get("/v1/jobs", params={"limit": 20}).status_code == 200
        reads.append((time.perf_counter() - started) * 1000)
        started = time.perf_counter()
        body = {"name": "probe", "account": "research", "gpus": 1, "command": ["true"]}
        answer = alice.post("/v1/jobs", json=body)
        assert answer.status_code == 202, answer.text
        job_id = answer.json()["id"]
        if jobs is not None:
            jobs.append(job_id)
        deadline = time.monotonic() + 300
        while (shown := alice.get(f"/v1/jobs/{job_id}")).status_code != 200 or shown.json()[
            "state"
        ] != "succeeded":
            assert time.monotonic() < deadline, f"probe job {job_id} did not succeed: {shown.text}"
            if shown.status_code != 200:
                answers[shown.status_code] = answers.get(shown.status_code, 0) + 1
            time.sleep(0.05)
        runs.append(time.perf_counter() - started)
    if answers:
        print(f"  (alice's polls answered {answers} before her job showed)", flush=True)
    return {"read ms": reads, "run s": runs}


class Attack:
    """An attack in threads of its own: `start`, then `stop` (joins them)."""

    def __init__(self, body: Callable[[threading.Event], None], threads: int = 1) -> None:
        self.stopping = threading.Event()
        self.threads = [
            threading.Thread(target=body, args=(self.stopping,), daemon=True)
            for _ in range(threads)
        ]

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        self.stopping.set()
        for thread in self.threads:
            thread.join(30)


def slowloris(port: int, refused: dict[str, int]) -> Attack:
    held: list[socket.socket] = []
    deadline = time.monotonic() + 600

    def body(stopping: threading.Event) -> None:
        while not stopping.is_set() and time.monotonic() < deadline:
            for index in range(2000):
                if stopping.is_set():
                    break
                if index < len(held) and held[index].fileno() != -1:
                    try:
                        held[index].send(b"X-a: b\r\n")  # still sending headers
                        continue
                    except OSError:
                        held[index].close()
                source = f"127.0.7.{1 + index % 20}"
                try:
                    conn = socket.create_connection(("127.0.0.1", port), 2, (source, 0))
                    conn.sendall(b"GET /v1/jobs HTTP/1.1\r\nHost: localhost\r\n")
                except OSError:
                    refused["connections"] = refused.get("connections", 0) + 1
                    continue
                if index < len(held):
                    held[index] = conn
                else:
                    held.append(conn)
            stopping.wait(1.0)
        for conn in held:
            conn.close()

    return Attack(body)


def streams(cluster: Cluster, refused: dict[str, int]) -> Attack:
    def body(stopping: threading.Event) -> None:
        token = cluster.token_for("mallory")
        opened = contextlib.ExitStack()
        with (
            httpx.Client(
                base_url=cluster.gateway_url,
                headers={"Authorization": f"Bearer {token}"},
                limits=httpx.Limits(max_connections=300),
                timeout=10,
            ) as mallory,
            opened,
        ):
            for index in range(200):
                answer = opened.enter_context(
                    mallory.stream("GET", "/v1/events", params={"job": f"nothing-{index}"})
                )
                if answer.status_code == 429:
                    refused["streams"] = refused.get("streams", 0) + 1
                    answer.close()
            stopping.wait(600)

    return Attack(body)


def replays(cluster: Cluster, refused: dict[str, int]) -> Attack:
    deadline = time.monotonic() + 600

    def body(stopping: threading.Event) -> None:
        token = cluster.token_for("mallory")
        headers = {"Authorization": f"Bearer {token}"}
        with httpx.Client(base_url=cluster.gateway_url, headers=headers, timeout=30) as mallory:
            while not stopping.is_set() and time.monotonic() < deadline:
                with mallory.stream("GET", "/v1/events", params={"after": 0}) as answer:
                    if answer.status_code == 429:
                        refused["replays"] = refused.get("replays", 0) + 1
                        stopping.wait(0.2)
                        continue
                    for read, _ in enumerate(answer.iter_bytes()):
                        if stopping.is_set() or read > 200:
                            break

    return Attack(body, threads=4)


def arrays(
    cluster: Cluster, refused: dict[str, int], made: list[str], account: str, size: int
) -> Attack:
    def body(stopping: threading.Event) -> None:
        with cluster.client_for("mallory") as mallory:
            task = {"name": "flood", "account": account, "gpus": 1, "command": ["true"]}
            big = mallory.post("/v1/job-batches", json={"jobs": [{**task, "array": 10_000}] * 1000})
            refused["batch of 10,000,000 tasks"] = int(big.status_code == 403)
            answer = mallory.post("/v1/jobs", json={**task, "array": size})
            assert answer.status_code == 202, answer.text
            made.append(answer.json()["id"])
            stopping.wait(600)

    return Attack(body)


def webhooks(cluster: Cluster, refused: dict[str, int]) -> Attack:
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(512)
    port = server.getsockname()[1]
    drips: list[socket.socket] = []

    def drip(stopping: threading.Event) -> None:
        server.settimeout(0.5)
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                conn, _ = server.accept()
                conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000000\r\n\r\n")
                drips.append(conn)
            for conn in list(drips):
                try:
                    conn.send(b"x")
                except OSError:
                    drips.remove(conn)
        for conn in drips:
            conn.close()
        server.close()

    with cluster.client_for("mallory") as mallory:
        for index in range(25):
            answer = mallory.post("/v1/webhooks", json={"url": f"http://127.0.0.1:{port}/h{index}"})
            if answer.status_code != 201:
                refused["webhooks"] = refused.get("webhooks", 0) + 1
    return Attack(drip)


@contextlib.contextmanager
def stack(workdir: Path, settings: list[str]) -> Iterator[Cluster]:
    nats = NatsServer(workdir / "nats").start()
    agents = {
        f"agent-{a}": [SimNode(f"n{a}-{i}", "A100-80GB", 8) for i in range(2)] for a in range(2)
    }
    env = {"GPULOOM_NODE_LOST_TIMEOUT_S": "60", "GPULOOM_HEARTBEAT_INTERVAL_S": "2"}
    env.update(setting.partition("=")[::2] for setting in settings)
    cluster = Cluster(nats.url, f"sqlite+aiosqlite:///{workdir}/db.sqlite", workdir / "data",
                      agents, env)  # fmt: skip
    cluster.start()
    try:
        cluster.wait_nodes_ready(4, timeout=120)
        yield cluster
    finally:
        cluster.stop()
        nats.stop()


#: The steps of a job's way, by the event that ends each (from the log's own `at`).
STEPS = ("JobAdmitted", "JobQueued", "JobPlaced", "JobStarted", "JobFinished")


def stages(cluster: Cluster, jobs: list[str]) -> str:
    """Where alice's jobs spent their time: the median ms from each step to the next
    (from JobSubmitted), by the log's timestamps."""
    wanted = set(jobs)
    at: dict[str, dict[str, float]] = {}
    for record in cluster.read_log():
        job_id = getattr(record.event, "job_id", None)
        if job_id in wanted:
            at.setdefault(job_id, {}).setdefault(record.event.TYPE, record.envelope.at.timestamp())
    parts = []
    previous = "JobSubmitted"
    for step in STEPS:
        gaps = [(t[step] - t[previous]) * 1000 for t in at.values() if step in t and previous in t]
        if gaps:
            parts.append(f"{step.removeprefix('Job').lower()} +{statistics.median(gaps):.0f}")
        previous = step
    return "ms: " + ", ".join(parts)


def summary(values: list[float]) -> tuple[float, float]:
    ordered = sorted(values)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def make_attack(
    name: str,
    cluster: Cluster,
    refused: dict[str, int],
    made: list[str],
    account: str,
    array_size: int,
) -> Attack:
    port = int(cluster.gateway_url.rsplit(":", 1)[1])
    if name == "slowloris":
        return slowloris(port, refused)
    if name == "streams":
        return streams(cluster, refused)
    if name == "replays":
        return replays(cluster, refused)
    if name == "arrays":
        return arrays(cluster, refused, made, account, array_size)
    if name == "webhooks":
        return webhooks(cluster, refused)
    return Attack(lambda stopping: None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--probes", type=int, default=15)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--attacker-account", default=ACCOUNT, help="mallory's account")
    parser.add_argument(
        "--array-size", type=int, default=10_000, help="mallory's array (her built-in most)"
    )
    parser.add_argument(
        "--env", action="append", default=[], help="GPULOOM_SETTING=VALUE for every service"
    )
    args = parser.parse_args()
    chosen = args.scenarios.split(",")
    with stack(Path(tempfile.mkdtemp(prefix="gpuloom-hostile-")), args.env) as cluster:
        with cluster.client_for("filler") as filler:  # a log to replay
            fill = []
            for _ in range(3):
                body = {"name": "fill", "account": "research", "gpus": 0, "command": ["true"]}
                fill.append(filler.post("/v1/jobs", json={**body, "array": 500}).json()["id"])
            deadline = time.monotonic() + 300  # idle means idle: the filler's tasks end first
            while any(cluster.job(a)["state"] not in FINAL_PHASES for a in fill):
                assert time.monotonic() < deadline, "the filler's tasks did not end"
                time.sleep(0.5)
        time.sleep(5)
        idle: dict[str, float] = {}
        print(f"{'scenario':<10} {'probe':<8} {'median':>9} {'p90':>9} {'x idle':>7}  refused")
        with cluster.client_for("alice") as alice:
            probe(alice, 3)  # warm up
            for name in chosen:
                refused: dict[str, int] = {}
                made: list[str] = []
                attack = make_attack(
                    name, cluster, refused, made, args.attacker_account, args.array_size
                )
                attack.start()
                time.sleep(3)  # the attack takes hold
                probes: list[str] = []
                got = probe(alice, args.probes, probes)
                attack.stop()
                for kind, values in got.items():
                    median, p90 = summary(values)
                    if name == "idle":
                        idle[kind] = median
                    ratio = median / idle[kind] if idle.get(kind) else float("nan")
                    print(
                        f"{name:<10} {kind:<8} {median:>9.3f} {p90:>9.3f} {ratio:>7.2f}  "
                        f"{refused or ''}",
                        flush=True,
                    )
                print(f"{'':<10} stages   {stages(cluster, probes)}", flush=True)
                with cluster.client_for("mallory") as mallory:  # her array ends before the next
                    for array_id in made:
                        mallory.delete(f"/v1/jobs/{array_id}")
                if made:
                    time.sleep(10)


if __name__ == "__main__":
    main()

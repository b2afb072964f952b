"""End-to-end throughput of gpuloom on this machine: real NATS, SQLite, every service
as its own process, simulated nodes, jobs submitted through the REST gateway.

Scenarios:
  placed  (default) 100 nodes x 8 GPUs, 5,000 short one-GPU jobs (`true`) submitted
          through the gateway: submitted-to-placed throughput (jobs/s: all placements
          over the span from the first submission to the last placement) and p50/p99
          submit-to-placed latency.
  started 16 nodes x 8 GPUs, 2,000 one-GPU jobs running `true`: jobs started per second
          (the process really running), p50/p99 submit-to-start latency of a single job on
          an idle cluster, and the time until all have finished.

Every figure is computed from the event log's own timestamps (`at` of JobSubmitted,
JobPlaced, JobStarted, JobFinished). `--profile DIR` runs each service under cProfile
and prints where the time went.

  python bench/e2e_throughput.py [--scenario placed|started] [--jobs N] [--profile DIR]
                                 [--env GPULOOM_SETTING=VALUE ...]

`--array` submits the jobs as one job array of N tasks (one request, one
JobArraySubmitted event), as Slurm's `sbatch --array=1-N`, its fastest path.

`--batch K` submits the jobs K per request (`POST /v1/job-batches`, one pipelined
write each), from `--concurrency` clients.

`--sse-clients N` keeps N clients reading the event stream (`GET /v1/events`, from
the log's end) during the run and prints each event's delivery latency to them
(bench/sse_clients.py); compare the throughput with and without them.

`--env` sets a setting of every service (e.g. GPULOOM_SNAPSHOT_EVERY_EVENTS=500 to
write snapshots often while deciding); the snapshots each service wrote, and how
long serializing each paused its loop, are printed from the services' logs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import pstats
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from sse_clients import ReaderProcess
from webhook_receiver import Receiver

from gpuloom.devstack import NatsServer
from gpuloom.events import JobArraySubmitted, JobFinished, JobPlaced, JobStarted, JobSubmitted
from gpuloom.testing.cluster import Cluster, SimNode, read_log


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


#: What one request of the bench sends: path, JSON body, headers.
Post = tuple[str, dict[str, Any], dict[str, str]]


def job_body(command: list[str], name: str) -> dict[str, Any]:
    return {"user": "bench", "account": "bench", "gpus": 1, "command": command, "name": name}


async def post_all(url: str, posts: list[Post], concurrency: int, token: str) -> float:
    """Send `posts` from `concurrency` keep-alive clients, each retried until it is
    accepted (202); return the seconds it took.

    aiohttp rather than httpx: the client shares the machine's two cores with the
    whole stack, so a lighter client leaves more of them to what is measured.
    """
    import aiohttp

    queue: asyncio.Queue[Post] = asyncio.Queue()
    for post in posts:
        queue.put_nowait(post)

    async def worker(session: aiohttp.ClientSession) -> None:
        while not queue.empty():
            path, body, headers = queue.get_nowait()
            for _ in range(50):
                async with session.post(path, json=body, headers=headers) as response:
                    text = await response.text()
                    if response.status == 202:
                        break
                await asyncio.sleep(0.2)
            else:
                raise RuntimeError(f"POST {path} failed: {text}")

    started = time.perf_counter()
    connector = aiohttp.TCPConnector(limit=concurrency)
    auth = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(url, connector=connector, headers=auth) as session:
        await asyncio.gather(*(worker(session) for _ in range(min(concurrency, len(posts)))))
    return time.perf_counter() - started


async def submit_all(
    url: str, count: int, command: list[str], concurrency: int, token: str
) -> float:
    """POST `count` jobs, one request each, from `concurrency` clients."""
    posts = [("/v1/jobs", job_body(command, f"b{i}"), {}) for i in range(count)]
    return await post_all(url, posts, concurrency, token)


async def submit_array(url: str, count: int, command: list[str], token: str) -> float:
    """POST one job array of `count` tasks; return the seconds it took."""
    import aiohttp

    body = {**job_body(command, "array"), "array": count}
    started = time.perf_counter()
    auth = {"Authorization": f"Bearer {token}"}
    async with (
        aiohttp.ClientSession(url, headers=auth) as session,
        session.post("/v1/jobs", json=body) as answer,
    ):
        if answer.status != 202:
            raise RuntimeError(f"array submission failed: {await answer.text()}")
    return time.perf_counter() - started


async def submit_batches(
    url: str, count: int, command: list[str], size: int, concurrency: int, token: str
) -> float:
    """POST `count` jobs `size` per request (`/v1/job-batches`) from `concurrency`
    clients; each batch's Idempotency-Key makes a retry add nothing twice."""
    posts: list[Post] = [
        (
            "/v1/job-batches",
            {"jobs": [job_body(command, f"b{i}") for i in range(start, min(count, start + size))]},
            {"Idempotency-Key": f"bench-{start}"},
        )
        for start in range(0, count, size)
    ]
    return await post_all(url, posts, concurrency, token)


def times_by_type(records: list) -> dict[str, dict[str, float]]:
    by_type: dict[str, dict[str, float]] = {
        "submitted": {},
        "placed": {},
        "started": {},
        "finished": {},
    }
    names = {
        JobSubmitted: "submitted",
        JobPlaced: "placed",
        JobStarted: "started",
        JobFinished: "finished",
    }
    for record in records:
        if isinstance(record.event, JobArraySubmitted):  # each task submitted with it
            for task in record.event.task_ids():
                by_type["submitted"].setdefault(task, record.envelope.at.timestamp())
            continue
        name = names.get(type(record.event))
        if name:
            by_type[name].setdefault(record.event.aggregate_id(), record.envelope.at.timestamp())
    return by_type


def wait_for(cluster: Cluster, predicate, timeout: float) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark did not complete in time")
        time.sleep(2)  # every poll costs the gateway CPU that the run is measuring


def count_state(cluster: Cluster, state: str) -> int:
    return int(cluster.http.get("/v1/jobs", params={"state": state, "limit": 1}).json()["total"])


def cpu_seconds(pids: dict[str, int]) -> dict[str, float]:
    """CPU time (user + system) each process has used so far, from /proc (Linux)."""
    ticks = os.sysconf("SC_CLK_TCK")
    used = {}
    for name, pid in pids.items():
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        used[name] = (int(fields[11]) + int(fields[12])) / ticks
        if name.startswith("agent"):  # its jobs' shims, launchers and commands, once reaped
            used[f"{name} jobs"] = (int(fields[13]) + int(fields[14])) / ticks
    used["whole machine"] = machine_busy_seconds()
    return used


def machine_busy_seconds() -> float:
    """CPU time every process of the machine has used (all but idle and iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / os.sysconf("SC_CLK_TCK")


def print_cpu(before: dict[str, float], after: dict[str, float], seconds: float) -> None:
    print(f"CPU per process during the run ({seconds:.1f} s wall, 2 cores = {2 * seconds:.0f} s):")
    for name in sorted(after, key=lambda n: before.get(n, 0) - after[n]):
        spent = after[name] - before.get(name, 0)
        print(f"  {name:<12} {spent:6.1f} s  ({100 * spent / seconds:4.0f}% of one core)")


def print_profiles(profile_dir: Path) -> None:
    for path in sorted(profile_dir.glob("*.prof")):
        print(f"\n--- profile: {path.stem} (top 12 by own time) ---")
        stats = pstats.Stats(str(path), stream=sys.stdout)
        stats.sort_stats("tottime").print_stats(12)


def print_snapshots(log_dir: Path) -> None:
    """Per service: snapshots written during the run and the pauses to serialize them."""
    pattern = re.compile(
        r"wrote its snapshot at seq \d+ \((\d+) bytes; the loop paused ([\d.]+) ms"
    )
    for path in sorted(log_dir.glob("*.log")):
        found = pattern.findall(path.read_text(errors="replace"))
        if not found:
            continue
        pauses = [float(ms) for _, ms in found]
        print(
            f"snapshots of {path.stem}: {len(found)}, up to {max(int(b) for b, _ in found)} bytes;"
            f" serializing paused its loop {statistics.median(pauses):.1f} ms median,"
            f" {max(pauses):.1f} ms at most"
        )


def print_stream(readers: ReaderProcess) -> None:
    ms = sorted(1000 * latency for latency in readers.latencies)
    if not ms:
        print("event stream: no event reached the clients")
        return
    print(
        f"event stream: {readers.count} clients, {min(readers.received)} to "
        f"{max(readers.received)} events each; delivery latency (writer to client) "
        f"p50 {percentile(ms, 0.5):.0f} ms, p99 {percentile(ms, 0.99):.0f} ms"
        + (f"; {len(readers.ended)} streams ended early" if readers.ended else "")
    )


def wait_webhooks(receiver: Receiver, records: list, hooks: int, timeout: float = 1800) -> None:  # type: ignore[type-arg]
    """Wait until every webhook got every event of the run, then print the figures."""
    registered = [r.seq for r in records if r.event.TYPE == "WebhookRegistered"]
    expected = hooks * sum(
        1 for r in records if r.seq > max(registered) and r.event.TYPE != "WebhookRegistered"
    )
    deadline = time.monotonic() + timeout
    while len(receiver.ids) < expected and time.monotonic() < deadline:
        time.sleep(0.5)
    receiver.stop()
    ms = sorted(1000 * latency for latency in receiver.latencies)
    span = max(receiver.received_at) - min(receiver.received_at)
    print(
        f"webhooks: {len(receiver.ids)} of {expected} deliveries ({receiver.repeats} repeated), "
        f"{len(receiver.ids) / span:.0f} deliveries/s over {span:.1f} s; delivery latency "
        f"(writer to receiver) p50 {percentile(ms, 0.5):.0f} ms, p99 {percentile(ms, 0.99):.0f} ms"
    )


def run(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="gpuloom-bench-"))
    nats = NatsServer(workdir / "nats").start()
    if args.scenario == "placed":
        nodes, per_agent, jobs = 100, 50, args.jobs or 5000
        command = ["true"]  # short jobs: GPUs free up, so all of them get placed in turn
    else:
        nodes, per_agent, jobs = 16, 8, args.jobs or 2000
        command = ["true"]
    agents = {
        f"agent-{a}": [SimNode(f"n{a:02d}-{i:03d}", "A100-80GB", 8) for i in range(per_agent)]
        for a in range(nodes // per_agent)
    }
    env = {"GPULOOM_NODE_LOST_TIMEOUT_S": "60", "GPULOOM_HEARTBEAT_INTERVAL_S": "2"}
    for setting in args.env:
        name, _, value = setting.partition("=")
        env[name] = value
    if args.profile:
        Path(args.profile).mkdir(parents=True, exist_ok=True)
        env["GPULOOM_PROFILE_DIR"] = str(Path(args.profile).resolve())
    cluster = Cluster(
        nats.url, f"sqlite+aiosqlite:///{workdir}/db.sqlite", workdir / "data", agents, env
    )
    cluster.start()
    try:
        cluster.wait_nodes_ready(nodes, timeout=120)
        # past the built-in 10,000 jobs a user may have pending (docs/security.md): the
        # bench's user may submit as many as it is asked to
        most = {"max_submit_jobs": max(jobs + 100, 10_000), "max_array_size": 10_000}
        cluster.http.put("/v1/limits/user/bench", json=most).raise_for_status()
        print(f"scenario {args.scenario}: {nodes} nodes x 8 GPUs, {jobs} one-GPU jobs", flush=True)
        if args.scenario == "started":
            idle = []
            for _ in range(20):
                job_id = cluster.submit(user="bench", account="bench", command=["true"])
                cluster.wait_final([job_id], timeout=30)
            records = cluster.read_log()
            t = times_by_type(records)
            idle = [t["started"][j] - t["submitted"][j] for j in t["started"]]
            base_seq = records[-1].seq
        assert cluster.stack is not None
        pids = {name: p.pid for name, p in cluster.stack.processes.items()}
        if nats.process is not None:
            pids["nats-server"] = nats.process.pid
        pids["bench client"] = os.getpid()
        token = cluster.token_for("bench")
        readers = ReaderProcess(cluster.gateway_url, token, args.sse_clients)
        if args.sse_clients:
            readers.start()
            pids["stream clients"] = readers.pid
            print(f"{args.sse_clients} clients follow the event stream", flush=True)
        receiver = Receiver()
        if args.webhooks:
            receiver.start()
            for hook in range(args.webhooks):
                answer = cluster.http.post("/v1/webhooks", json={"url": f"{receiver.url}/h{hook}"})
                answer.raise_for_status()
            print(f"{args.webhooks} webhooks get every event", flush=True)
        cpu_before, wall_before = cpu_seconds(pids), time.perf_counter()
        if args.array:
            submit_s = asyncio.run(submit_array(cluster.gateway_url, jobs, command, token))
        elif args.batch:
            submit_s = asyncio.run(
                submit_batches(
                    cluster.gateway_url, jobs, command, args.batch, args.concurrency, token
                )
            )
        else:
            submit_s = asyncio.run(
                submit_all(cluster.gateway_url, jobs, command, args.concurrency, token)
            )
        print(
            f"submitted {jobs} jobs in {submit_s:.2f} s ({jobs / submit_s:.0f} submissions/s)",
            flush=True,
        )
        if args.scenario == "placed":
            wait_for(cluster, lambda: count_state(cluster, "succeeded") >= jobs, 900)
        else:
            wait_for(cluster, lambda: count_state(cluster, "succeeded") >= jobs + 20, 900)
        print_cpu(cpu_before, cpu_seconds(pids), time.perf_counter() - wall_before)
        if args.sse_clients:
            time.sleep(2)  # the last events reach the streams
            readers.stop()
            print_stream(readers)
        records = asyncio.run(read_log(nats.url))
        if args.webhooks:
            wait_webhooks(receiver, records, args.webhooks)
    finally:
        cluster.stop()
        nats.stop()
    print_snapshots(workdir / "data" / "logs")
    t = times_by_type(records)
    if args.scenario == "placed":
        placed = [j for j in t["placed"] if j in t["submitted"]]
        latencies = [t["placed"][j] - t["submitted"][j] for j in placed]
        span = max(t["placed"][j] for j in placed) - min(t["submitted"][j] for j in placed)
        print(
            f"placed {len(placed)} jobs; submitted-to-placed throughput {len(placed) / span:.0f} jobs/s"
        )
        print(
            f"submit-to-placed latency p50 {percentile(latencies, 0.5) * 1000:.0f} ms, p99 {percentile(latencies, 0.99) * 1000:.0f} ms"
        )
    else:
        burst = [
            task
            for r in records
            if r.seq > base_seq
            for task in (
                r.event.task_ids()
                if isinstance(r.event, JobArraySubmitted)
                else [r.event.aggregate_id()]
                if isinstance(r.event, JobSubmitted)
                else []
            )
        ]
        starts = sorted(t["started"][j] for j in burst)
        first_submit = min(t["submitted"][j] for j in burst)
        last_finish = max(t["finished"][j] for j in burst)
        print(f"jobs started per second: {len(starts) / (starts[-1] - first_submit):.0f}")
        print(
            f"idle submit-to-start latency over 20 single jobs: p50 {percentile(idle, 0.5) * 1000:.0f} ms, p99 {percentile(idle, 0.99) * 1000:.0f} ms"
        )
        print(
            f"all {len(burst)} jobs finished {last_finish - first_submit:.1f} s after the first submission"
        )
    if args.profile:
        print_profiles(Path(args.profile))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scenario", choices=["placed", "started"], default="placed")
    parser.add_argument("--jobs", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--array", action="store_true", help="one job array of N tasks")
    parser.add_argument("--batch", type=int, default=0, help="K jobs per request")
    parser.add_argument("--profile", default="")
    parser.add_argument("--sse-clients", type=int, default=0, help="event stream readers")
    parser.add_argument(
        "--webhooks", type=int, default=0, help="webhooks of every event, to a local receiver"
    )
    parser.add_argument("--env", action="append", default=[], help="GPULOOM_X=VALUE (repeat)")
    run(parser.parse_args())


if __name__ == "__main__":
    main()

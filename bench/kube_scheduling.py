"""Pods bound per second by a real kube-scheduler v1.20.2, alone and with gpuloom's
extender (docs/kubernetes.md), in one run.

Two rounds, one after the other, each on a fresh control plane (etcd, kube-apiserver,
kube-scheduler; `gpuloom.testing.kubecluster`, no kubelet: pods are only bound):

  alone     kube-scheduler with no extender; `--nodes` fake Nodes, each with
            `gpuloom.io/gpu: --gpus-per-node` in its capacity, so that kube-scheduler
            counts the extended resource itself.
  extender  the same, with gpuloom's extender and watcher beside a whole gpuloom stack
            (NATS JetStream, SQLite, every service its own process); the Nodes are
            labelled `gpuloom.io/model: A100` and the run starts once gpuloom has them
            all ready.

Each round then creates `--pods` one-GPU pods as fast as it can (`--concurrency` at
once) and follows them with a watch of pods, which stamps the moment each pod first has
`spec.nodeName` (and, with the extender, gpuloom's `gpuloom.io/node` annotation, which
the watcher writes once gpuloom placed it). Pods bound per second: bound pods over the
span from the first create to the last bind. Create-to-bound: per pod, from just before
its POST to the watch event that shows it bound. When the pods ask for more GPUs than
the Nodes have, only as many as fit are waited for (the rest stay Pending, as they
should), and the figures are over those.

Also printed, from kube-scheduler's own /metrics (the difference over the pods' phase):
its scheduling attempts by result and attempts per bound pod; and, with the extender,
the extender's latency per verb (filter, prioritize, bind) from its Prometheus
histogram `gpuloom_extender_verb_seconds`, scraped from the extender process
(`GPULOOM_METRICS_PORT`, given to it alone). Both histograms are bucketed: a p50/p99
here is interpolated linearly within its bucket, as Prometheus' histogram_quantile
does. The extender round ends with checks of gpuloom's log: its size, exactly one
JobSubmitted per pod (its key is the pod's UID), and `gpuloom audit` of the whole log
(every placement re-made); the run fails when a pod has two, or the audit a mismatch.

Where the time goes: each round prints the CPU seconds of every process (control plane,
gpuloom's services, NATS, this one: from /proc) over the pods' phase; kube-scheduler's
failed attempts per pod (its -v=2 log); and, with the extender, each bound pod's steps
from the log's own timestamps (create, JobSubmitted at its first filter, JobPlaced, the
watcher's annotation, bound) and the pods the watcher nudged (`gpuloom.io/nudged`). A
round that runs past `--timeout` still reports what it saw. The defaults ask for 1,000
GPUs of 800: 800 are waited for, and 200 pods stay Pending meanwhile, as they should.

  python bench/kube_scheduling.py [--pods 1000] [--nodes 100] [--gpus-per-node 8]
                                  [--concurrency 50] [--timeout 900] [--keep DIR]

Needs the control plane built by `make kube` (~/.cache/gpuloom/k8s-1.20.2/bin).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import re
import shutil
import sys
import tempfile
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from gpuloom.events import JobPlaced, JobStarted, JobSubmitted, Recorded
from gpuloom.kube.vocabulary import NUDGED, PLACED_NODE
from gpuloom.kubeapi import Gone, KubeClient, KubeConfig, Obj, pod_path
from gpuloom.natsserver import free_ports
from gpuloom.testing.cluster import Cluster
from gpuloom.testing.kubecluster import (
    SKIP_REASON,
    KubeControlPlane,
    binaries,
    gpuloom_for,
    make_node,
    make_pod,
)
from gpuloom.testing.servers import nats_jetstream

NS = "default"
POD_PREFIX = "bench-"
MODEL = "A100"
VERBS = ("filter", "prioritize", "bind")
#: How often the progress line is printed while pods are bound.
PROGRESS_EVERY_S = 15.0

# -- figures ---------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    if not ordered:
        return math.nan
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


#: A histogram as Prometheus exposes it: (upper bound, cumulative count), +Inf last.
Buckets = list[tuple[float, float]]


def histogram_quantile(buckets: Buckets, q: float) -> float:
    """The `q` quantile of a bucketed histogram, interpolated linearly within the bucket
    it falls in (as Prometheus' histogram_quantile); in the +Inf bucket, minus the largest
    finite bound (it is above that: `ms` writes it "> N ms"); nan when empty."""
    if not buckets or buckets[-1][1] <= 0:
        return math.nan
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            if math.isinf(bound):
                return -lower
            if cumulative == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (cumulative - below)
        lower, below = bound, cumulative
    return lower


#: Samples of one scrape: (sample name, sorted label items) -> value.
Scrape = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Scrape:
    """Every sample at a /metrics URL; empty when it does not answer."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            text = response.read().decode()
    except OSError as exc:
        print(f"  (could not scrape {url}: {exc})")
        return {}
    samples: Scrape = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def since(after: Scrape, before: Scrape) -> Scrape:
    """What each sample (a counter, a histogram's bucket) gained between two scrapes."""
    return {key: value - before.get(key, 0.0) for key, value in after.items()}


def buckets_of(samples: Scrape, name: str, **labels: str) -> Buckets:
    """The buckets of histogram `name` whose labels include `labels` (summed over the
    other labels)."""
    summed: dict[float, float] = {}
    for (sample, items), value in samples.items():
        if sample != f"{name}_bucket":
            continue
        found = dict(items)
        if any(found.get(k) != v for k, v in labels.items()):
            continue
        bound = float(found["le"])
        summed[bound] = summed.get(bound, 0.0) + value
    return sorted(summed.items())


def total_of(samples: Scrape, name: str, **labels: str) -> float:
    return sum(
        value
        for (sample, items), value in samples.items()
        if sample == name and all(dict(items).get(k) == v for k, v in labels.items())
    )


# -- CPU ---------------------------------------------------------------------------------

TICK = os.sysconf("SC_CLK_TCK")
CORES = os.cpu_count() or 1


def cpu_of(pid: int) -> float:
    """CPU seconds (user + system) process `pid` used so far; nan when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def machine_busy() -> float:
    """CPU seconds the whole machine spent busy so far (not idle, not iowait)."""
    values = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return (sum(values) - values[3] - values[4]) / TICK


def cpu_now(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of each named process, this one (`bench`) and the machine."""
    used = {name: cpu_of(pid) for name, pid in pids.items()}
    mine = os.times()
    used["bench (this process)"] = mine.user + mine.system
    used["machine (busy)"] = machine_busy()
    return used


def ms(seconds: float) -> str:
    """Milliseconds; a negative value is a quantile above the histogram's last bound."""
    if math.isnan(seconds):
        return "n/a"
    return f"> {-seconds * 1000:.0f} ms" if seconds < 0 else f"{seconds * 1000:.1f} ms"


def secs(seconds: float) -> str:
    return "n/a" if math.isnan(seconds) else f"{seconds:.2f} s"


# -- one round -------------------------------------------------------------------------


@dataclass
class PodTimes:
    """Wall-clock stamps (time.time()) per pod name."""

    created: dict[str, float] = field(default_factory=dict)
    placed: dict[str, float] = field(default_factory=dict)
    bound: dict[str, float] = field(default_factory=dict)
    node: dict[str, str] = field(default_factory=dict)
    uid: dict[str, str] = field(default_factory=dict)
    #: the `gpuloom.io/nudged` values the watcher wrote on each pod
    nudges: dict[str, set[str]] = field(default_factory=dict)
    creates_done: float = 0.0

    def note(self, pod: Obj, now: float) -> None:
        meta = pod.get("metadata") or {}
        name = str(meta.get("name") or "")
        if not name.startswith(POD_PREFIX):
            return
        notes = meta.get("annotations") or {}
        if name not in self.placed and PLACED_NODE in notes:
            self.placed[name] = now
        if NUDGED in notes:
            self.nudges.setdefault(name, set()).add(str(notes[NUDGED]))
        node = (pod.get("spec") or {}).get("nodeName")
        if node and name not in self.bound:
            self.bound[name] = now
            self.node[name] = str(node)


@dataclass
class Round:
    name: str
    pods: int
    target: int
    times: PodTimes
    scheduler: Scrape = field(default_factory=dict)
    extender: Scrape = field(default_factory=dict)
    #: pod name -> kube-scheduler's failed attempts for it (from its log)
    failures: Counter[str] = field(default_factory=Counter)
    #: CPU seconds each process used while the pods were created and bound
    cpu: dict[str, float] = field(default_factory=dict)
    #: the seconds over which `cpu` was counted
    cpu_wall: float = 0.0
    #: the machine's 1-minute load average as the pods' phase began
    load: float = 0.0

    @property
    def first_create(self) -> float:
        return min(self.times.created.values())

    @property
    def span(self) -> float:
        return max(self.times.bound.values()) - self.first_create if self.times.bound else 0.0

    @property
    def rate(self) -> float:
        return len(self.times.bound) / self.span if self.span else 0.0

    def latencies(self) -> list[float]:
        t = self.times
        return [t.bound[n] - t.created[n] for n in t.bound if n in t.created]


async def make_nodes(config: KubeConfig, count: int, gpus: int, labels: dict[str, str]) -> None:
    limits = httpx.Limits(max_connections=20, max_keepalive_connections=20)
    async with KubeClient(config, limits=limits, user_agent="gpuloom-bench") as kube:
        gate = asyncio.Semaphore(16)

        async def one(index: int) -> None:
            async with gate:
                await make_node(kube, f"kn-{index:04d}", gpus, labels)

        await asyncio.gather(*(one(i) for i in range(count)))


async def follow(
    kube: KubeClient, version: str, times: PodTimes, target: int, done: asyncio.Event
) -> None:
    """Stamp each pod's changes as the watch brings them, until `target` are bound;
    watch again where it ended (list again after a 410)."""
    while True:
        try:
            async with contextlib.aclosing(kube.watch(pod_path(NS), version, 120)) as changes:
                async for kind, pod in changes:
                    version = str((pod.get("metadata") or {}).get("resourceVersion") or version)
                    if kind in ("ADDED", "MODIFIED"):
                        times.note(pod, time.time())
                        if len(times.bound) >= target:
                            done.set()
        except Gone:
            items, version = await kube.list(pod_path(NS))
            now = time.time()
            for pod in items:
                times.note(pod, now)
            if len(times.bound) >= target:
                done.set()


async def bind_pods(
    config: KubeConfig, count: int, target: int, concurrency: int, timeout: float
) -> PodTimes:
    """Create `count` one-GPU pods, `concurrency` at once, and follow them until `target`
    are bound (or `timeout` seconds from the first create)."""
    times = PodTimes()
    limits = httpx.Limits(
        max_connections=concurrency + 4, max_keepalive_connections=concurrency + 4
    )
    async with KubeClient(config, limits=limits, user_agent="gpuloom-bench") as kube:
        _, version = await kube.list(pod_path(NS))
        done = asyncio.Event()
        watching = asyncio.create_task(follow(kube, version, times, target, done))
        gate = asyncio.Semaphore(concurrency)

        async def create(index: int) -> None:
            name = f"{POD_PREFIX}{index:05d}"
            async with gate:
                times.created[name] = time.time()
                pod = await make_pod(kube, NS, name, 1)
                times.uid[name] = str(pod["metadata"]["uid"])

        started = time.monotonic()
        try:
            creating = asyncio.gather(*(create(i) for i in range(count)))
            await creating
            times.creates_done = time.time()
            print(
                f"  {count} pods created in {time.monotonic() - started:.1f} s "
                f"({len(times.bound)} bound by then)",
                flush=True,
            )
            while not done.is_set():
                left = timeout - (time.monotonic() - started)
                if left <= 0:
                    print(f"  TIMEOUT: {len(times.bound)} of {target} bound after {timeout:.0f} s")
                    break
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(done.wait(), min(PROGRESS_EVERY_S, left))
                if watching.done():
                    watching.result()  # the watch failed: say why
                print(
                    f"  {time.monotonic() - started:6.1f} s: {len(times.bound)} bound"
                    + (f", {len(times.placed)} placed by gpuloom" if times.placed else ""),
                    flush=True,
                )
        finally:
            watching.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watching
    return times


FAILED = re.compile(r'Unable to schedule pod[^\n]*?pod="default/(' + POD_PREFIX + r'\d+)"')


def scheduler_failures(log: Path) -> Counter[str]:
    """Failed attempts per pod, from kube-scheduler's log (-v=2 says each one)."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return Counter()
    return Counter(FAILED.findall(text))


#: Seconds after the last bind before kube-scheduler's metrics are read again: its
#: bindings run beside its cycle, and count once they return.
SETTLE_S = 3.0


def run_round(
    name: str,
    plane: KubeControlPlane,
    options: argparse.Namespace,
    before_pods: Callable[[], None] | None = None,
    pids: Callable[[], dict[str, int]] | None = None,
) -> Round:
    """Nodes, then pods, on a started control plane; `before_pods()` runs between.
    `pids()`: the processes beside the control plane's whose CPU is counted."""
    config = plane.kube_config()
    capacity = options.nodes * options.gpus_per_node
    target = min(options.pods, capacity)
    started = time.monotonic()
    asyncio.run(
        make_nodes(config, options.nodes, options.gpus_per_node, {"gpuloom.io/model": MODEL})
    )
    print(f"  {options.nodes} Nodes made in {time.monotonic() - started:.1f} s", flush=True)
    if before_pods is not None:
        before_pods()
    metrics = f"http://127.0.0.1:{plane.scheduler_port}/metrics"
    before = scrape(metrics)
    processes = {p: plane.pid(p) or 0 for p in ("etcd", "apiserver", "scheduler")}
    processes.update(pids() if pids is not None else {})
    load = os.getloadavg()[0]
    cpu_before, began = cpu_now(processes), time.monotonic()
    times = asyncio.run(
        bind_pods(config, options.pods, target, options.concurrency, options.timeout)
    )
    cpu_after = cpu_now(processes)
    result = Round(name, options.pods, target, times, load=load)
    result.cpu = {k: cpu_after[k] - cpu_before[k] for k in cpu_after}
    result.cpu_wall = time.monotonic() - began
    time.sleep(SETTLE_S)
    result.scheduler = since(scrape(metrics), before)
    result.failures = scheduler_failures(plane.log_path("scheduler"))
    return result


def alone(base: Path, options: argparse.Namespace) -> Round:
    print("kube-scheduler alone (no extender)", flush=True)
    with KubeControlPlane(base / "alone", extender_url=None) as plane:
        return run_round("alone", plane, options)


@dataclass
class LogFigures:
    events: int
    by_type: Counter[str]
    submitted_per_pod: Counter[int]
    #: pod name -> (JobSubmitted at, first JobPlaced at, first JobStarted at)
    stamps: dict[str, tuple[float, float, float]]
    audit_verified: int
    audit_seconds: float
    audit_mismatches: list[str]

    def twice(self) -> int:
        """Pods with more than one JobSubmitted (none: a pod's UID is its key)."""
        return sum(pods for count, pods in self.submitted_per_pod.items() if count > 1)


def log_figures(cluster: Cluster, times: PodTimes, timeout: float) -> LogFigures:
    """gpuloom's log, once every pod's JobSubmitted is in it (or `timeout` passed)."""
    keys = {f"k8s:{uid}": name for name, uid in times.uid.items()}
    deadline = time.monotonic() + timeout
    while True:
        records: list[Recorded] = cluster.read_log()
        submitted = Counter(
            r.event.idempotency_key
            for r in records
            if isinstance(r.event, JobSubmitted) and r.event.idempotency_key in keys
        )
        if len(submitted) >= len(keys) or time.monotonic() > deadline:
            break
        time.sleep(2)
    job_of: dict[str, str] = {}
    at: dict[tuple[str, str], float] = {}
    for r in records:
        event = r.event
        if isinstance(event, JobSubmitted) and event.idempotency_key in keys:
            job_of[event.job_id] = keys[event.idempotency_key]
        kind = type(event).__name__
        if isinstance(event, JobSubmitted | JobPlaced | JobStarted) and event.job_id in job_of:
            at.setdefault((job_of[event.job_id], kind), r.envelope.at.timestamp())
    stamps = {
        pod: (
            at.get((pod, "JobSubmitted"), math.nan),
            at.get((pod, "JobPlaced"), math.nan),
            at.get((pod, "JobStarted"), math.nan),
        )
        for pod in keys.values()
    }
    per_pod = Counter(submitted.get(key, 0) for key in keys)
    print("  gpuloom audit of the whole log ...", flush=True)
    began = time.monotonic()
    verified, mismatches = 0, []
    try:
        verified = cluster.assert_audit_passes().verified
    except AssertionError as failed:  # said in the report, then the run fails
        mismatches = [str(failed)]
    return LogFigures(
        events=len(records),
        by_type=Counter(type(r.event).__name__ for r in records),
        submitted_per_pod=per_pod,
        stamps=stamps,
        audit_verified=verified,
        audit_seconds=time.monotonic() - began,
        audit_mismatches=mismatches,
    )


@contextlib.contextmanager
def gpuloom_beside(base: Path) -> Iterator[tuple[KubeControlPlane, Cluster, int]]:
    """A control plane whose kube-scheduler asks gpuloom's extender, and the gpuloom
    stack (with the extender and the watcher) it asks; yields them and the extender's
    metrics port. Everything is stopped on the way out, whatever happened."""
    extender_port, metrics_port = free_ports(2)
    plane = KubeControlPlane(
        base / "k8s", extender_url=f"http://127.0.0.1:{extender_port}/scheduler"
    )
    with plane, nats_jetstream(base / "nats") as nats_url:
        cluster = gpuloom_for(
            plane,
            nats_url,
            base,
            extender_port,
            service_env={"extender": {"GPULOOM_METRICS_PORT": str(metrics_port)}},
        )
        try:
            cluster.start()
            yield plane, cluster, metrics_port
        finally:
            plane.stop_scheduler()  # first: no verb is then cut short by the extender's stop
            cluster.stop()
            for log in sorted((base / "data" / "logs").glob("*.log")):
                text = log.read_text(errors="replace")
                if "Traceback" in text:
                    print(f"--- {log} has a traceback (its tail) ---\n{text[-3000:]}")


def with_extender(base: Path, options: argparse.Namespace) -> tuple[Round, LogFigures]:
    print("kube-scheduler with gpuloom's extender", flush=True)
    with gpuloom_beside(base / "extender") as (plane, cluster, metrics_port):
        metrics = f"http://127.0.0.1:{metrics_port}/metrics"
        before: Scrape = {}

        def ready() -> None:
            began = time.monotonic()
            cluster.wait_nodes_ready(options.nodes, timeout=120)
            print(
                f"  gpuloom has {options.nodes} nodes ready after "
                f"{time.monotonic() - began:.1f} s more",
                flush=True,
            )
            before.update(scrape(metrics))

        def pids() -> dict[str, int]:
            assert cluster.stack is not None
            found = {name: p.pid for name, p in cluster.stack.processes.items()}
            nats = base / "extender" / "nats.pid"
            with contextlib.suppress(OSError, ValueError):
                found["nats-server"] = int(nats.read_text().strip())
            return found

        result = run_round("extender", plane, options, before_pods=ready, pids=pids)
        result.extender = since(scrape(metrics), before)
        figures = log_figures(cluster, result.times, timeout=120)
        return result, figures


# -- the report ------------------------------------------------------------------------


def report_round(r: Round) -> None:
    t = r.times
    late = r.latencies()
    print(f"\n[{r.name}] {len(t.bound)} of {r.pods} pods bound (waited for {r.target})")
    if r.pods > r.target:
        print(f"  {r.pods - r.target} pods cannot fit ({r.target} GPUs) and stay Pending")
    per_node = Counter(t.node.values())
    if per_node:
        print(f"  pods per node: at most {max(per_node.values())}, over {len(per_node)} nodes")
    print(f"  creates took {t.creates_done - r.first_create:.1f} s")
    print(f"  first create to last bind: {r.span:.1f} s: {r.rate:.1f} pods/s")
    print(
        f"  create to bound: p50 {secs(percentile(late, 0.5))}, p99 {secs(percentile(late, 0.99))}, "
        f"max {secs(max(late, default=math.nan))}"
    )
    if t.nudges:
        unheard = [sum(v.isdigit() for v in seen) for seen in t.nudges.values()]
        queued = sum(any(v.startswith("queued-") for v in seen) for seen in t.nudges.values())
        print(
            f"  the watcher nudged {len(t.nudges)} pods: {sum(1 for u in unheard if u)} as "
            f"unheard of 10 s after they were made ({sum(unheard)} nudges, {max(unheard)} on "
            f"one pod at most), {queued} once their job was queued"
        )
    if t.placed:
        placed = [t.placed[n] - t.created[n] for n in t.placed if n in t.created]
        then = [t.bound[n] - t.placed[n] for n in t.bound if n in t.placed]
        print(
            f"  create to gpuloom's annotation (placed): p50 {secs(percentile(placed, 0.5))}, "
            f"p99 {secs(percentile(placed, 0.99))}; annotation to bound: "
            f"p50 {secs(percentile(then, 0.5))}, p99 {secs(percentile(then, 0.99))}"
        )
    s = r.scheduler
    if s:
        results = {
            result: total_of(s, "scheduler_schedule_attempts_total", result=result)
            for result in ("scheduled", "unschedulable", "error")
        }
        print(
            "  kube-scheduler attempts: "
            + ", ".join(f"{k} {v:.0f}" for k, v in results.items())
            + f" ({sum(results.values()) / max(1, len(t.bound)):.2f} per bound pod)"
        )
        failed_s = total_of(
            s, "scheduler_e2e_scheduling_duration_seconds_sum", result="unschedulable"
        )
        placed_s = total_of(s, "scheduler_scheduling_algorithm_duration_seconds_sum")
        print(
            f"  kube-scheduler's one-pod-at-a-time cycle was busy {failed_s + placed_s:.1f} s "
            f"of the {r.span:.1f} s: {failed_s:.1f} s in failed attempts, {placed_s:.1f} s "
            "finding the node of those that bound (their bindings run beside it)"
        )
        attempts = buckets_of(s, "scheduler_pod_scheduling_attempts")
        if attempts:
            print(
                "  attempts per bound pod (kube-scheduler's histogram, buckets 1,2,4,8,16): "
                + ", ".join(
                    f"<={bound:g}: {count:.0f}" for bound, count in attempts if count or bound < 2
                )
            )
        for name, label in (
            ("scheduler_scheduling_algorithm_duration_seconds", "algorithm (filter, score)"),
            ("scheduler_e2e_scheduling_duration_seconds", "attempt (+ binding if it bound)"),
            ("scheduler_binding_duration_seconds", "binding"),
        ):
            b = buckets_of(s, name)
            if b and b[-1][1]:
                print(
                    f"  kube-scheduler {label}: p50 {ms(histogram_quantile(b, 0.5))}, "
                    f"p99 {ms(histogram_quantile(b, 0.99))} ({b[-1][1]:.0f})"
                )
    if t.bound:
        bound_failed = [r.failures.get(n, 0) for n in t.bound]
        spread = Counter(bound_failed)
        worst = sorted(t.bound, key=lambda n: -r.failures.get(n, 0))[:3]
        print(
            f"  failed attempts before a pod was bound (kube-scheduler's log): mean "
            f"{sum(bound_failed) / len(bound_failed):.2f}; failures -> pods "
            f"{dict(sorted(spread.items()))}; most: "
            + ", ".join(f"{n} {r.failures.get(n, 0)}" for n in worst)
        )
        unbound = [r.failures.get(n, 0) for n in t.created if n not in t.bound]
        if unbound:
            print(
                f"  the {len(unbound)} pods left Pending failed {sum(unbound)} attempts "
                f"({max(unbound)} at most) meanwhile"
            )
    if r.cpu:
        busy = r.cpu.pop("machine (busy)", math.nan)
        print(
            f"  CPU while the pods were created and bound ({r.cpu_wall:.1f} s; the machine, "
            f"load {r.load:.1f} as it began, was busy {busy:.1f} s of "
            f"{CORES * r.cpu_wall:.1f} on {CORES} cores): "
            + ", ".join(
                f"{k} {v:.1f} s"
                for k, v in sorted(r.cpu.items(), key=lambda kv: -kv[1])
                if not math.isnan(v) and v >= 0.05
            )
        )


def report_extender(r: Round, log: LogFigures) -> dict[str, tuple[float, float, float]]:
    """Print the extender's verbs and the log's figures; return verb -> (calls, p50, p99)."""
    verbs: dict[str, tuple[float, float, float]] = {}
    if r.extender:
        print(
            "  extender per verb (gpuloom_extender_verb_seconds, interpolated within buckets "
            "0.5, 1, 2.5, 5, 10, 25, 50, 100 ms ...):"
        )
        for verb in VERBS:
            b = buckets_of(r.extender, "gpuloom_extender_verb_seconds", verb=verb)
            calls = b[-1][1] if b else 0.0
            p50, p99 = histogram_quantile(b, 0.5), histogram_quantile(b, 0.99)
            verbs[verb] = (calls, p50, p99)
            print(
                f"    {verb:<10} {calls:6.0f} calls ({calls / max(1, r.pods):.2f} per pod): "
                f"p50 {ms(p50)}, p99 {ms(p99)}"
            )
    else:
        print("  the extender's metrics could not be scraped: no per-verb latency")
    print(f"  gpuloom's log: {log.events} events ({log.events / max(1, r.pods):.1f} per pod)")
    print("    " + ", ".join(f"{k} {v}" for k, v in sorted(log.by_type.items())))
    per_pod = log.submitted_per_pod
    if per_pod.get(1, 0) == r.pods:
        verdict = "every pod exactly one"
    elif log.twice():
        verdict = f"{log.twice()} pods MORE THAN ONE"
    else:
        verdict = f"none more than one; {per_pod.get(0, 0)} never asked about by kube-scheduler yet"
    print(f"  JobSubmitted per pod (count -> pods): {dict(sorted(per_pod.items()))}: {verdict}")
    steps: dict[str, list[float]] = {k: [] for k in ("created", "submitted", "placed", "bound")}
    t = r.times
    for pod, (submitted, placed, _started) in log.stamps.items():
        if pod in t.bound and not math.isnan(submitted + placed):
            steps["created"].append(submitted - t.created[pod])
            steps["submitted"].append(placed - submitted)
            steps["placed"].append(t.placed.get(pod, t.bound[pod]) - placed)
            steps["bound"].append(t.bound[pod] - t.placed.get(pod, t.bound[pod]))
    if steps["created"]:
        print("  where a bound pod's time went (p50 / p99):")
        for label, key in (
            ("create -> JobSubmitted (first filter)", "created"),
            ("JobSubmitted -> JobPlaced (gpuloom's queue)", "submitted"),
            ("JobPlaced -> annotated (the watcher)", "placed"),
            ("annotated -> bound (kube-scheduler again, bind)", "bound"),
        ):
            values = steps[key]
            print(
                f"    {label:<50} {secs(percentile(values, 0.5))} / "
                f"{secs(percentile(values, 0.99))}"
            )
    print(
        f"  gpuloom audit: {log.audit_verified} decisions re-made in {log.audit_seconds:.1f} s, "
        f"{len(log.audit_mismatches)} mismatches"
    )
    return verbs


def summary(
    first: Round, second: Round, verbs: dict[str, tuple[float, float, float]], log: LogFigures
) -> None:
    def row(label: str, a: str, b: str) -> None:
        print(f"| {label:<34} | {a:>18} | {b:>18} |")

    print("\n## Summary\n")
    row("", "kube-scheduler alone", "with the extender")
    print(f"|{'-' * 36}|{'-' * 19}:|{'-' * 19}:|")
    row(
        "pods bound",
        f"{len(first.times.bound)}/{first.pods}",
        f"{len(second.times.bound)}/{second.pods}",
    )
    row("first create to last bind", f"{first.span:.1f} s", f"{second.span:.1f} s")
    row("pods bound/s", f"{first.rate:.1f}", f"{second.rate:.1f}")
    for q in (0.5, 0.99):
        row(
            f"create to bound p{int(q * 100)}",
            secs(percentile(first.latencies(), q)),
            secs(percentile(second.latencies(), q)),
        )
    for verb, (calls, p50, p99) in verbs.items():
        row(f"extender {verb} p50 / p99 ({calls:.0f})", "", f"{ms(p50)} / {ms(p99)}")
    row("gpuloom log events", "", str(log.events))
    ratio = second.rate / first.rate if first.rate else math.nan
    print(f"\nratio of pods bound per second, with the extender / alone: {ratio:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--nodes", type=int, default=100)
    parser.add_argument("--gpus-per-node", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=50, help="pod creates at once")
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds a round waits for its pods"
    )
    parser.add_argument("--keep", type=Path, help="work here and keep the logs (else a temp dir)")
    options = parser.parse_args()
    if binaries() is None:
        sys.exit(SKIP_REASON)
    if options.pods > options.nodes * options.gpus_per_node:
        print(
            f"note: {options.pods} one-GPU pods, {options.nodes * options.gpus_per_node} GPUs: "
            f"{options.nodes * options.gpus_per_node} are waited for, the rest stay Pending"
        )
    print(
        f"{options.pods} pods of one GPU, {options.nodes} nodes x {options.gpus_per_node} "
        f"GPUs, {options.concurrency} creates at once; {time.strftime('%Y-%m-%d %H:%M:%S %Z')}, "
        f"load average {os.getloadavg()[0]:.1f} on {CORES} cores",
        flush=True,
    )
    base = options.keep or Path(tempfile.mkdtemp(prefix="gpuloom-kube-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        first = alone(base, options)
        report_round(first)
        second, log = with_extender(base, options)
        report_round(second)
        verbs = report_extender(second, log)
        summary(first, second, verbs, log)
        if log.audit_mismatches or log.twice():
            sys.exit("FAILED: the audit found mismatches, or a pod has more than one JobSubmitted")
    finally:
        if options.keep is None:
            shutil.rmtree(base, ignore_errors=True)
        else:
            print(f"logs kept under {base}")


if __name__ == "__main__":
    main()

"""A real gpuloom cluster for integration tests and benchmarks: NATS JetStream, a
database, every service as its own process, node agents serving simulated nodes —
plus readers and checkers of the resulting log."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import httpx
import yaml

from gpuloom.audit import AuditReport, audit
from gpuloom.auth import OPERATOR, ensure_secret, issue_token
from gpuloom.bus.reader import read_log
from gpuloom.devstack import SERVICES, Stack, free_port, migrate, wait_http
from gpuloom.events import (
    JobCancelled,
    JobFinished,
    JobRejected,
    Recorded,
)
from gpuloom.state import FINAL_PHASES, ClusterState, apply

T = TypeVar("T")

FINAL_EVENTS = (JobFinished, JobRejected, JobCancelled)


@dataclass(frozen=True)
class SimNode:
    name: str
    model: str
    count: int
    memory_mib: int = 81920
    pool: str = "physical"
    lends_remote_vgpu: bool = False
    labels: tuple[tuple[str, str], ...] = ()
    #: (level, domain), tightest level first.
    topology: tuple[tuple[str, str], ...] = ()


#: The operator whose token the cluster's own client carries.
OPERATOR_NAME = "ops"

#: As `make run`'s (deploy/inventory/): two nodes in two domains of each topology level.
DEFAULT_NODES = (
    SimNode(
        "node-a", "A100-80GB", 4, topology=(("nvlink", "nvl-a"), ("rack", "r1"), ("block", "b1"))
    ),
    SimNode(
        "node-b", "H100-80GB", 2, topology=(("nvlink", "nvl-b"), ("rack", "r2"), ("block", "b2"))
    ),
)


def write_inventory(path: Path, nodes: Sequence[SimNode]) -> Path:
    doc = {
        "nodes": [
            {
                "name": n.name,
                "gpus": {
                    "model": n.model,
                    "count": n.count,
                    "memory_mib": n.memory_mib,
                    "pool": n.pool,
                },
                "lends_remote_vgpu": n.lends_remote_vgpu,
                "labels": dict(n.labels),
                "topology": dict(n.topology),
            }
            for n in nodes
        ]
    }
    path.write_text(yaml.safe_dump(doc, sort_keys=False))  # topology: tightest level first
    return path


@dataclass
class Cluster:
    """Service processes around one NATS and one database, driven over REST."""

    nats_url: str
    database_url: str
    data_dir: Path
    agents: Mapping[str, Sequence[SimNode]]
    env: Mapping[str, str] = field(default_factory=dict)
    #: Variables of one agent's process only, by agent name.
    agent_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: Variables of one service's process only, by service name.
    service_env: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    #: Services started beside the core ones (`devstack.KUBE_SERVICES`: the Kubernetes
    #: extender and watcher, given GPULOOM_KUBECONFIG in `env`).
    extra_services: Sequence[str] = ()
    stack: Stack | None = None
    gateway_url: str = ""
    client: httpx.Client | None = None

    def start(self) -> Cluster:
        migrate(self.database_url)
        port = free_port()
        self.gateway_url = f"http://127.0.0.1:{port}"
        env = {
            "GPULOOM_GATEWAY_PORT": str(port),
            "GPULOOM_HEARTBEAT_INTERVAL_S": "0.5",
            "GPULOOM_NODE_LOST_TIMEOUT_S": "6",
            "GPULOOM_CANCEL_GRACE_S": "1",
            # the test receivers of webhooks listen on 127.0.0.1
            "GPULOOM_WEBHOOK_ALLOW_PRIVATE": "true",
            **self.env,
        }
        self.stack = Stack.for_urls(self.nats_url, self.database_url, self.data_dir, env)
        for name in (*SERVICES, *self.extra_services):
            self.stack.start(name, env=self.service_env.get(name))
        for agent, nodes in self.agents.items():
            inventory = write_inventory(self.data_dir / f"{agent}.yaml", nodes)
            names = [node.name for node in nodes]
            self.stack.start(
                agent,
                "agent",
                ["--inventory", str(inventory)],
                nodes=names,
                env=self.agent_env.get(agent),
            )
        wait_http(f"{self.gateway_url}/healthz", timeout=60)
        self.client = self.client_for(OPERATOR_NAME, roles=[OPERATOR])
        return self

    def token_for(self, user: str, roles: Sequence[str] = (), ttl_s: int = 3600) -> str:
        """A bearer token for `user`, signed with this cluster's secret (as `gpuloom token issue`)."""
        secret = ensure_secret(self.data_dir / "auth" / "jwt.key")
        return issue_token(secret, user, now=datetime.now(UTC), ttl_s=ttl_s, roles=roles)

    def client_for(self, user: str, roles: Sequence[str] = ()) -> httpx.Client:
        """An HTTP client of the gateway that calls as `user` with `roles`."""
        token = self.token_for(user, roles)
        return httpx.Client(
            base_url=self.gateway_url, timeout=30, headers={"Authorization": f"Bearer {token}"}
        )

    def stop(self) -> None:
        if self.client:
            self.client.close()
        if self.stack:
            self.stack.stop()

    # --- REST ------------------------------------------------------------------------

    @property
    def http(self) -> httpx.Client:
        assert self.client is not None, "cluster not started"
        return self.client

    def submit(self, **job: Any) -> str:
        body = {"name": "job", "user": "alice", "account": "research", "gpus": 1, **job}
        response = self.http.post("/v1/jobs", json=body)
        assert response.status_code == 202, response.text
        job_id: str = response.json()["id"]
        return job_id

    def job(self, job_id: str, appear_within: float = 10) -> dict[str, Any]:
        """The job as the operator reads it. A read waits for the caller's own writes
        only: another user's submission reaches the rows a moment later, so a 404 is
        asked again for `appear_within` seconds."""
        deadline = time.monotonic() + appear_within
        while (response := self.http.get(f"/v1/jobs/{job_id}")).status_code == 404:
            if time.monotonic() > deadline:
                break
            time.sleep(0.05)
        assert response.status_code == 200, response.text
        doc: dict[str, Any] = response.json()
        return doc

    def wait_nodes_ready(self, count: int, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            nodes = self.http.get("/v1/nodes").json()["nodes"]
            if sum(1 for n in nodes if n["state"] == "ready") >= count:
                return
            time.sleep(0.2)
        raise TimeoutError(f"fewer than {count} nodes ready after {timeout}s")

    def wait_state(self, job_ids: Iterable[str], state: str, timeout: float = 60) -> None:
        """Wait until every job is in `state` (fails fast if one ends instead)."""
        pending = list(job_ids)
        deadline = time.monotonic() + timeout
        while pending:
            job = self.job(pending[0])
            if job["state"] == state:
                pending.pop(0)
                continue
            assert job["state"] not in FINAL_PHASES, f"{job['id']} ended {job['state']}: {job}"
            if time.monotonic() > deadline:
                raise TimeoutError(f"{job['id']} is {job['state']}, not {state}")
            time.sleep(0.2)

    def wait_final(self, job_ids: Iterable[str], timeout: float = 120) -> dict[str, dict[str, Any]]:
        """Wait until every job is in a final state; return their views."""
        pending = set(job_ids)
        done: dict[str, dict[str, Any]] = {}
        deadline = time.monotonic() + timeout
        while pending and time.monotonic() < deadline:
            jobs = self.http.get("/v1/jobs", params={"limit": 5000}).json()["jobs"]
            for job in jobs:
                if job["id"] in pending and job["state"] in FINAL_PHASES:
                    done[job["id"]] = job
                    pending.discard(job["id"])
            if pending:
                time.sleep(0.25)
        if pending:
            states = {j: self.job(j)["state"] for j in sorted(pending)[:10]}
            raise TimeoutError(f"{len(pending)} jobs not final after {timeout}s: {states}")
        return done

    def inject_faults(self, *faults: tuple[str, int, str, str]) -> None:
        """Make the simulated agents see these GPU faults, `(node, index, check,
        evidence)`, and no other: the file every agent of this cluster reads
        (`services.agent.health.InjectedFaults`), replaced in one rename."""
        path = self.data_dir / "agent" / "faults.yaml"
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = [
            {"node": node, "index": index, "check": check, "evidence": evidence}
            for node, index, check, evidence in faults
        ]
        temporary = path.with_suffix(".tmp")
        temporary.write_text(yaml.safe_dump(entries))
        temporary.replace(path)

    def read_log(self) -> list[Recorded]:
        return asyncio.run(read_log(self.nats_url))

    def assert_audit_passes(self, forged: str | None = None) -> AuditReport:
        """`gpuloom audit` of the whole log: every cycle decision re-made. `forged`: text
        of the mismatch a test's hand-made decision gives on purpose, the only one allowed."""
        report = audit(self.read_log())
        unexpected = [m for m in report.mismatches if forged is None or forged not in m]
        assert not unexpected, unexpected
        assert len(report.mismatches) <= 1, report.mismatches
        return report


@dataclass
class LogCheck:
    """What a whole log says about safety: voided events, final events per job, GPU overlap."""

    state: ClusterState
    voided: list[tuple[int, str]]
    finals_applied: Counter[str]
    #: (node, gpu) pairs whose run intervals of two jobs overlapped in time.
    overlaps: list[str]
    max_allocated: dict[str, int]


def wait_for(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    """What `predicate` returns once it is truthy (asked every 0.1 s); TimeoutError
    saying `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        time.sleep(0.1)
    raise TimeoutError(what)


@contextlib.contextmanager
def simulated_cluster(
    base: Path,
    agents: Mapping[str, Sequence[SimNode]],
    agent_env: Mapping[str, Mapping[str, str]] | None = None,
) -> Iterator[Cluster]:
    """A running cluster of `agents` (agent name -> its simulated nodes), each agent a
    process of its own (with `agent_env[agent]` added to its environment), on its own
    JetStream NATS and SQLite under `base`; it yields once every node is ready and
    stops everything after."""
    from gpuloom.testing.servers import nats_jetstream

    with nats_jetstream(base / "nats") as url:
        cluster = Cluster(
            url,
            f"sqlite+aiosqlite:///{base}/gpuloom.db",
            base / "data",
            agents,
            agent_env=agent_env or {},
        )
        try:
            cluster.start()
            cluster.wait_nodes_ready(sum(len(nodes) for nodes in agents.values()))
            yield cluster
        finally:
            cluster.stop()


def check_log(records: Sequence[Recorded]) -> LogCheck:
    # The whole history: a check looks at jobs that ended and were charged long ago.
    state = ClusterState()
    voided: list[tuple[int, str]] = []
    finals: Counter[str] = Counter()
    max_allocated: dict[str, int] = {}
    intervals: dict[tuple[str, int], list[tuple[float, float, str]]] = {}
    for record in records:
        before = state.voided
        job_before = None
        event = record.event
        if isinstance(event, JobFinished):
            job = state.jobs.get(event.job_id)
            if job is not None and job.current_run() is not None:
                job_before = (job.node or "", job.gpu_indexes, job.current_run())
        apply(state, record, keep_history=True)
        if state.voided > before:
            voided.append((record.seq, state.recent_voided[-1].reason))
            continue
        if isinstance(event, FINAL_EVENTS):
            finals[event.aggregate_id()] += 1
        if job_before is not None and isinstance(event, JobFinished):
            node_name, indexes, run = job_before
            assert run is not None and run.ended_at is not None
            for index in indexes:
                intervals.setdefault((node_name, index), []).append(
                    (run.started_at.timestamp(), run.ended_at.timestamp(), event.job_id)
                )
        for name, node_state in state.nodes.items():
            held = sum(1 for gpu in node_state.gpus.values() if gpu.job_id is not None)
            max_allocated[name] = max(max_allocated.get(name, 0), held)
    overlaps = []
    for (node, index), spans in sorted(intervals.items()):
        spans.sort()
        for (_s1, e1, j1), (s2, _e2, j2) in itertools.pairwise(spans):
            if s2 < e1:
                overlaps.append(f"{node}/{index}: {j1} and {j2}")
    return LogCheck(state, voided, finals, overlaps, max_allocated)

"""The monitoring that ships (deploy/monitoring/) against a running stack: every metric
an alert rule or a Grafana panel names is in what some process of the stack exposes on
its /metrics, scraped over HTTP from each (every service with its metrics port, and the
gateway's /metrics). A query naming a series nobody exports would wait, or show, forever.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from gpuloom.devstack import SERVICES
from gpuloom.natsserver import free_ports
from gpuloom.testing.cluster import DEFAULT_NODES, Cluster

pytestmark = pytest.mark.integration

MONITORING = Path(__file__).resolve().parents[2] / "deploy" / "monitoring"


@pytest.fixture
def scraped_cluster(nats_url: str, tmp_path: Path) -> Iterator[tuple[Cluster, dict[str, int]]]:
    names = [*SERVICES, "agent-a", "agent-b"]
    ports = dict(zip(names, free_ports(len(names)), strict=True))  # distinct: one per process

    def metrics_at(name: str) -> dict[str, str]:
        return {"GPULOOM_METRICS_PORT": str(ports[name])}

    cluster = Cluster(
        nats_url,
        f"sqlite+aiosqlite:///{tmp_path}/gpuloom.db",
        tmp_path / "data",
        {"agent-a": [DEFAULT_NODES[0]], "agent-b": [DEFAULT_NODES[1]]},
        service_env={name: metrics_at(name) for name in SERVICES},
        agent_env={name: metrics_at(name) for name in ("agent-a", "agent-b")},
    )
    try:
        cluster.start()
        cluster.wait_nodes_ready(2)
        yield cluster, ports
    finally:
        cluster.stop()


def families(text: str) -> set[str]:
    """The series names of an exposition (a counter's with `_total`, as queries say)."""
    names = set()
    for family in text_string_to_metric_families(text):
        names.add(family.name)
        names.update(sample.name for sample in family.samples)
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names


def queried() -> dict[str, set[str]]:
    """Each gpuloom metric a rule or a panel names, with what names it."""
    rules = yaml.safe_load((MONITORING / "gpuloom-rules.yaml").read_text())["groups"]
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text())
    queries = [(f"rule {r.get('alert')}", r["expr"]) for g in rules for r in g["rules"]]
    queries += [
        (f"panel {p['title']}", t["expr"]) for p in dashboard["panels"] for t in p["targets"]
    ]
    named: dict[str, set[str]] = {}
    for where, query in queries:
        for metric in re.findall(r"\bgpuloom_[a-z_]+", query):
            named.setdefault(metric, set()).add(where)
    return named


def test_every_metric_the_rules_and_the_dashboard_query_is_scraped_live(
    scraped_cluster: tuple[Cluster, dict[str, int]],
) -> None:
    cluster, ports = scraped_cluster
    job = cluster.submit(gpus=1, command=["true"])  # jobs placed, run, charged
    cluster.wait_final([job])
    exposed: set[str] = set()
    for name, port in ports.items():
        answer = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10)
        assert answer.status_code == 200, (name, answer.status_code)
        exposed |= families(answer.text)
    gateway = cluster.http.get("/metrics")  # the cluster's gauges, with the operator's token
    assert gateway.status_code == 200, gateway.status_code
    exposed |= families(gateway.text)
    missing = {
        metric: sorted(where) for metric, where in queried().items() if metric not in exposed
    }
    assert not missing, f"queried but exported by no process of the stack: {missing}"

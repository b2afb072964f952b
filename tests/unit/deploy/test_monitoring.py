"""The monitoring that ships with gpuloom (deploy/monitoring/): `promtool` finds the alert
rules valid and their tests pass (each alert fires on the series that should raise it,
and not before); the PrometheusRule for the Prometheus operator holds the same groups;
and every metric a rule or a panel of the Grafana dashboard names is one gpuloom
exports, so no alert waits on, and no panel shows, a series that never comes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from datetime import UTC, datetime
from pathlib import Path

import pytest
import yaml
from prometheus_client import REGISTRY, Metric

import services.gateway.connections
import services.gateway.stream_budget
from gpuloom.bus.messages import StreamFigures
from gpuloom.state import ClusterState
from gpuloom.telemetry import metrics as service_metrics
from services.gateway.metrics import StreamCollector
from services.gateway.reads.gauges import cluster_metrics

MONITORING = Path(__file__).resolve().parents[3] / "deploy" / "monitoring"
RULES = MONITORING / "gpuloom-rules.yaml"
DASHBOARD = MONITORING / "grafana-dashboard.json"
#: The modules whose metrics register on import (`REGISTRY`): every service's, and the
#: gateway's own.
REGISTERING = (service_metrics, services.gateway.connections, services.gateway.stream_budget)


def promtool() -> str:
    found = shutil.which("promtool")
    if found is None:
        pytest.fail("promtool is missing: install Debian's `prometheus` (.ci/run does)")
    return found


def test_promtool_finds_the_rules_valid_and_their_tests_pass() -> None:
    checked = subprocess.run(
        [promtool(), "check", "rules", str(RULES)], capture_output=True, text=True, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [promtool(), "test", "rules", "gpuloom-rules.test.yaml"],
        capture_output=True,
        text=True,
        cwd=MONITORING,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    tested_alerts = set(
        re.findall(r"alertname: (\w+)", (MONITORING / "gpuloom-rules.test.yaml").read_text())
    )
    assert tested_alerts == set(alert_names()), "every alert has a test"


def test_the_prometheusrule_holds_the_same_groups() -> None:
    operator = yaml.safe_load((MONITORING / "prometheusrule.yaml").read_text())
    assert operator["kind"] == "PrometheusRule"
    assert operator["spec"]["groups"] == yaml.safe_load(RULES.read_text())["groups"]


def test_every_metric_a_rule_or_a_panel_names_is_exported() -> None:
    for what, queries in (("rules", [r["expr"] for r in rules()]), ("panels", panel_queries())):
        missing = metrics_in(queries) - exported()
        assert not missing, f"{what} name metrics nobody exports: {sorted(missing)}"


def test_the_dashboard_is_grafana_json_with_a_datasource_to_choose() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] == "gpuloom-cluster" and dashboard["panels"]
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    for panel in dashboard["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]


def metrics_in(queries: list[str]) -> set[str]:
    return {name for query in queries for name in re.findall(r"\bgpuloom_[a-z_]+", query)}


def panel_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [target["expr"] for panel in dashboard["panels"] for target in panel["targets"]]


def rules() -> list[dict[str, str]]:
    return [
        rule for group in yaml.safe_load(RULES.read_text())["groups"] for rule in group["rules"]
    ]


def alert_names() -> list[str]:
    return [rule["alert"] for rule in rules()]


def exported() -> set[str]:
    """The names of every series gpuloom's processes expose (a counter's with `_total`)."""
    assert REGISTERING  # imported for what they register
    state = ClusterState(clock=datetime(2026, 1, 1, tzinfo=UTC))  # every family, empty or not
    families: list[Metric] = [*REGISTRY.collect(), *cluster_metrics(state, state.clock)]
    stream = StreamCollector()
    stream.figures = StreamFigures(10, 1000, 1, 10, max_bytes=2000, max_messages=20)
    families += stream.collect()
    names: set[str] = set()
    for family in families:
        names.add(family.name)
        if family.type == "counter":
            names.add(f"{family.name}_total")
    return names

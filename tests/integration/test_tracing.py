"""One submission is one trace across the service processes, exported over OTLP."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gpuloom.testing.cluster import DEFAULT_NODES, Cluster
from gpuloom.testing.otlp import OtlpReceiver

pytestmark = pytest.mark.integration


def test_a_submission_is_one_trace_across_services(nats_url: str, tmp_path: Path) -> None:
    database_url = f"sqlite+aiosqlite:///{tmp_path}/gpuloom.db"
    with OtlpReceiver() as receiver:
        env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "100"}
        cluster = Cluster(
            nats_url, database_url, tmp_path / "data", {"agent-a": [DEFAULT_NODES[0]]}, env
        ).start()
        try:
            cluster.wait_nodes_ready(1)
            job_id = cluster.submit(command=["true"])
            cluster.wait_final([job_id], timeout=60)
            deadline = time.monotonic() + 15
            while True:
                spans = receiver.snapshot()
                submit = [s for s in spans if s.name.startswith("POST /v1/jobs")]
                trace = {s.service for s in spans if submit and s.trace_id == submit[0].trace_id}
                if len(trace) >= 5 or time.monotonic() > deadline:
                    break
                time.sleep(0.2)
            cluster.assert_audit_passes()
        finally:
            cluster.stop()
    assert submit, f"no gateway span among {[(s.service, s.name) for s in spans][:20]}"
    in_trace = [s for s in spans if s.trace_id == submit[0].trace_id]
    services = {s.service for s in in_trace}
    assert {
        "gpuloom-gateway",
        "gpuloom-admission",
        "gpuloom-queue",
        "gpuloom-placement",
    } <= services
    assert "gpuloom-agent" in services
    ids = {s.span_id for s in in_trace}
    orphans = [s for s in in_trace if s.parent_span_id and s.parent_span_id not in ids]
    assert orphans == [], "every span's parent is in the same trace"

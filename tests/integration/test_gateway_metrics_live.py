"""/metrics of a running gateway process follows the cluster: a job that runs shows in
the jobs-by-state and allocation gauges, and leaves them when it is cancelled."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpuloom.testing.cluster import Cluster

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
A100 = (("model", "A100-80GB"), ("pool", "physical"))


def scrape(cluster: Cluster) -> Samples:
    response = cluster.http.get("/metrics", follow_redirects=False)
    assert response.status_code == 200, (response.status_code, response.headers)
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def wait_metrics(cluster: Cluster, ok: Callable[[Samples], bool], timeout: float = 30) -> Samples:
    deadline = time.monotonic() + timeout
    while not ok(got := scrape(cluster)):
        assert time.monotonic() < deadline, {k: v for k, v in got.items() if "gpuloom" in k[0]}
        time.sleep(0.2)
    return got


def jobs(got: Samples, state: str) -> float:
    return got.get(("gpuloom_jobs", (("state", state),)), -1)


def test_metrics_follow_a_running_job(shared_cluster: Cluster) -> None:
    cluster = shared_cluster
    job = cluster.submit(gpus=2, gpu_model=["A100-80GB"], command=["sleep", "120"])
    cluster.wait_state([job], "running")
    got = wait_metrics(cluster, lambda g: jobs(g, "running") == 1)
    assert got[("gpuloom_gpus", A100)] == 4
    assert got[("gpuloom_gpus_allocated", A100)] == 2
    assert got[("gpuloom_gpu_milli", A100)] == 4000
    assert got[("gpuloom_gpu_milli_allocated", A100)] == 2000
    assert got[("gpuloom_queue_length", ())] == 0
    assert got[("gpuloom_placements_total", ())] >= 1
    assert got[("gpuloom_placements_last_minute", ())] >= 1
    lags = [value for (name, _), value in got.items() if name == "gpuloom_projection_lag"]
    assert lags and all(lag >= 0 for lag in lags), got
    # the log's size, for operators who watch its growth (the full log is kept)
    held, size = got[("gpuloom_stream_messages", ())], got[("gpuloom_stream_bytes", ())]
    first, last = got[("gpuloom_stream_first_seq", ())], got[("gpuloom_stream_last_seq", ())]
    assert 0 < held <= last and first == 1 and size > 100 * held, got
    # one server, one copy, as configured; the log is kept whole: no limit to come near
    replicas = (got[("gpuloom_stream_replicas", (("state", "wanted"),))],
                got[("gpuloom_stream_replicas", (("state", "current"),))])  # fmt: skip
    assert replicas == (1, 1), got
    assert got[("gpuloom_stream_max_bytes", ())] == got[("gpuloom_stream_max_messages", ())] == -1

    assert cluster.http.delete(f"/v1/jobs/{job}").status_code in (200, 202)
    cluster.wait_final([job], timeout=30)
    got = wait_metrics(cluster, lambda g: jobs(g, "cancelled") == 1)
    assert jobs(got, "running") == 0
    assert got[("gpuloom_gpus_allocated", A100)] == 0
    assert got[("gpuloom_gpu_milli_allocated", A100)] == 0

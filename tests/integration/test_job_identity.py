"""Jobs run as an unprivileged account in their own folder; the scheduler's variables are its own."""

from __future__ import annotations

import os

import pytest

from gpuloom.testing.cluster import Cluster
from services.agent.uids import DEFAULT_UID_RANGE, allocate, is_local_id

pytestmark = pytest.mark.integration

#: The stack's agents run as this test does: as root they run alice's jobs as her own
#: uid from the default range (services.agent.uids), else as themselves.
AGENT_IS_ROOT = os.geteuid() == 0
JOB_UID = allocate("alice", {}, DEFAULT_UID_RANGE, is_local_id) if AGENT_IS_ROOT else os.geteuid()


def test_a_job_runs_as_the_unprivileged_account_and_cannot_touch_another_jobs_folder(
    shared_cluster: Cluster,
) -> None:
    cluster = shared_cluster
    first = cluster.submit(gpus=0, command=["sh", "-c", "echo first"])
    assert cluster.wait_final([first])[first]["state"] == "succeeded"
    node = cluster.job(first)["node"]
    # from the job's working directory <root>/<node>/<job>/<attempt>/work
    other = f"../../../../{node}/{first}/1"
    probe = f"""
id -u
pwd -P | sed 's|.*/||'
touch mine && echo wrote-own-folder
ls {other}/exit >/dev/null && echo sees-other-folder
for target in {other}/exit {other}/pid {other}/forged ../forged ../exit; do
  (echo forged >> "$target") 2>/dev/null && echo "wrote $target"
done
echo its-own-log > /dev/stderr
exit 0
"""
    second = cluster.submit(gpus=0, command=["sh", "-c", probe])

    job = cluster.wait_final([second])[second]
    assert job["state"] == "succeeded", job
    logs = cluster.http.get(f"/v1/jobs/{second}/logs").json()
    lines = logs["stdout"].splitlines()
    assert lines[:4] == [str(JOB_UID), "work", "wrote-own-folder", "sees-other-folder"], logs
    if AGENT_IS_ROOT:
        assert lines[4:] == [], "a job wrote the agent's records or another job's folder"
    assert logs["stderr"] == "its-own-log\n"  # reopening its own log works
    first_logs = cluster.http.get(f"/v1/jobs/{first}/logs").json()
    assert first_logs["stdout"] == "first\n"
    assert cluster.job(first)["state"] == "succeeded"


@pytest.mark.parametrize(
    "env",
    [
        {"CUDA_VISIBLE_DEVICES": "0"},
        {"SEED": "1", "GPULOOM_JOB_ID": "someone-else"},
        {"LD_PRELOAD": "/tmp/inject.so"},
        {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": "100"},
    ],
    ids=["gpu selection", "gpuloom variable", "loader injection", "mps limit"],
)
@pytest.mark.parametrize("array", [None, 3], ids=["job", "array"])
def test_an_env_that_overrides_the_schedulers_variables_gets_422_naming_it(
    shared_cluster: Cluster, env: dict[str, str], array: int | None
) -> None:
    body = {
        "name": "sneaky",
        "user": "alice",
        "account": "research",
        "gpus": 1,
        "command": ["true"],
        "env": env,
        "array": array,
    }
    response = shared_cluster.http.post("/v1/jobs", json=body)

    assert response.status_code == 422, response.text
    [name] = [name for name in env if name != "SEED"]
    assert f"body.env.{name}" in response.json()["detail"]


def test_an_env_that_sets_only_the_jobs_own_variables_is_accepted(shared_cluster: Cluster) -> None:
    env = {"LD_LIBRARY_PATH": "/opt/lib", "SEED": "7", "HOME": "/elsewhere"}
    job_id = shared_cluster.submit(
        gpus=0, env=env, command=["sh", "-c", 'echo "$SEED $LD_LIBRARY_PATH $HOME"']
    )

    assert shared_cluster.wait_final([job_id])[job_id]["state"] == "succeeded"
    logs = shared_cluster.http.get(f"/v1/jobs/{job_id}/logs").json()
    assert logs["stdout"] == "7 /opt/lib /elsewhere\n"

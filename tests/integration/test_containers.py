"""Jobs that name an image run in a real podman container (docs/containers.md).

Two agents: `agent-c` finds podman, `agent-p` is told not to use it
(`GPULOOM_AGENT_CONTAINERS=off`), so placement must send image jobs to node-c even
though node-p comes first by name. The image is built here, from Debian's static
busybox (no registry is reachable), with a file of its own to tell it from the host.
podman runs with runc (Debian 12's crun refuses this kernel's hybrid cgroups) and
lower ulimits, through the standard `CONTAINERS_CONF`.
"""

from __future__ import annotations

import shutil
import subprocess
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpuloom.client.cli import app
from gpuloom.testing.cluster import Cluster, SimNode, simulated_cluster
from services.agent.containers import container_of

IMAGE = "localhost/gpuloom-test-busybox:1"
MARKER = "built for the gpuloom container tests"
BUSYBOX = Path("/bin/busybox")
APPLETS = ("sh", "sleep", "id", "cat", "echo", "env", "pwd", "touch", "ls", "test", "[")


def busybox_is_static() -> bool:
    return BUSYBOX.is_file() and b"ld-linux" not in BUSYBOX.read_bytes()[:4096]


pytestmark = pytest.mark.skipif(
    shutil.which("podman") is None or not busybox_is_static(),
    reason="needs podman and a static /bin/busybox (.ci/run installs podman, runc, busybox-static)",
)


def podman(*args: str, env: dict[str, str], check: bool = True) -> str:
    done = subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 or not check, done.stderr
    return done.stdout


def build_image(folder: Path, env: dict[str, str]) -> None:
    """A busybox image with a marker file, imported from a tar (`podman import`)."""
    rootfs = folder / "rootfs.tar"
    with tarfile.open(rootfs, "w") as tar:
        for name in ("bin", "etc", "tmp"):
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            tar.addfile(info)
        tar.add(BUSYBOX, "bin/busybox")
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        marker = folder / "marker"
        marker.write_text(MARKER + "\n")
        tar.add(marker, "etc/gpuloom-test")
    podman("import", "--change", "ENV=PATH=/bin", str(rootfs), IMAGE, env=env)


@pytest.fixture(scope="module")
def podman_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("podman")
    conf = folder / "containers.conf"
    runtime = '[engine]\nruntime = "runc"\n' if shutil.which("runc") else ""
    conf.write_text(
        '[containers]\ndefault_ulimits = ["nofile=1024:1024", "nproc=1000:1000"]\n' + runtime
    )
    env = {"CONTAINERS_CONF": str(conf), "PATH": "/usr/local/bin:/usr/bin:/bin"}
    build_image(folder, env)
    return env


@pytest.fixture(scope="module")
def containers(
    tmp_path_factory: pytest.TempPathFactory, podman_env: dict[str, str]
) -> Iterator[Cluster]:
    nodes = {
        "agent-c": [SimNode("node-c", "A100-80GB", 2)],
        "agent-p": [SimNode("node-p", "A100-80GB", 2)],
        "agent-x": [SimNode("node-x", "A100-80GB", 2)],
    }
    broken = Path(podman_env["CONTAINERS_CONF"]).with_name("broken.conf")
    broken.write_text('[engine]\nruntime = "no-such-oci-runtime"\n')
    agent_env = {
        "agent-c": {
            "CONTAINERS_CONF": podman_env["CONTAINERS_CONF"],
            "GPULOOM_AGENT_CONTAINERS": "podman",
            "GPULOOM_AGENT_IMAGE_PULL": "never",
        },
        "agent-p": {"GPULOOM_AGENT_CONTAINERS": "off"},
        # podman answers `--version`, but cannot start a container with this runtime
        "agent-x": {"CONTAINERS_CONF": str(broken)},
    }
    try:
        with simulated_cluster(tmp_path_factory.mktemp("containers"), nodes, agent_env) as cluster:
            yield cluster
    finally:  # the agents are gone; so must be any container a failed test left running
        names = podman("ps", "--all", "--format={{.Names}}", env=podman_env).split()
        left = [name for name in names if name.startswith("gpuloom-node-c-")]
        if left:
            podman("rm", "--force", "--time=0", *left, env=podman_env, check=False)


def run_folder(cluster: Cluster, job_id: str) -> Path:
    return next(cluster.data_dir.glob(f"**/node-c/{job_id}/1"))


def containers_of(job_id: str, env: dict[str, str]) -> list[str]:
    return podman(
        "ps", "--all", "--filter", f"label=gpuloom.job={job_id}", "--format={{.Names}}", env=env
    ).split()


def wait_gone(job_id: str, env: dict[str, str], timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while containers_of(job_id, env):
        assert time.monotonic() < deadline, f"the container of {job_id} was left behind"
        time.sleep(0.2)


def test_nodes_say_which_runtimes_they_have(containers: Cluster) -> None:
    nodes = {n["name"]: n for n in containers.http.get("/v1/nodes").json()["nodes"]}
    assert nodes["node-c"]["runtimes"] == ["podman"]
    assert nodes["node-p"]["runtimes"] == []
    # podman installed, but no container starts: the node does not say it runs images
    assert nodes["node-x"]["runtimes"] == []
    said = (containers.data_dir / "logs" / "agent-x.log").read_text()
    assert "podman cannot start a container here" in said and "no-such-oci-runtime" in said


def test_an_image_job_runs_in_its_container_as_the_jobs_account(containers: Cluster) -> None:
    script = (
        "cat /etc/gpuloom-test; id -u; pwd; echo HOME=$HOME; echo GPUS=$CUDA_VISIBLE_DEVICES; "
        "echo JOB=$GPULOOM_JOB_ID; echo SECRET=$TEAM_SECRET; echo PATH=$PATH; "
        "test -e /etc/debian_version && echo HOST-VISIBLE; touch $HOME/written && echo wrote; "
        "echo to-stderr >&2"
    )
    env = {
        "GPULOOM_TOKEN": containers.token_for("alice"),
        "GPULOOM_GATEWAY_URL": containers.gateway_url,
    }
    submitted = CliRunner().invoke(
        app,
        ["submit", "--account", "research", "--gpus", "1", "--image", IMAGE,
         "--env", "TEAM_SECRET=s3 cr=t", "--wait", "--", "sh", "-c", script],
        env=env,
    )  # fmt: skip
    assert submitted.exit_code == 0, submitted.output
    job_id = submitted.stdout.split()[0]
    job = containers.job(job_id)
    assert (job["state"], job["node"]) == ("succeeded", "node-c"), job
    assert job["request"]["image"] == IMAGE
    logs = containers.http.get(f"/v1/jobs/{job_id}/logs").json()
    work = str(run_folder(containers, job_id) / "work")
    lines = logs["stdout"].splitlines()
    assert lines[0] == MARKER  # the image's file system, not the node's
    assert 200_000 <= int(lines[1]) <= 299_999  # alice's own uid from the range, not root
    assert lines[2] == work and f"HOME={work}" in lines
    assert "GPUS=0" in lines and f"JOB={job_id}" in lines and "SECRET=s3 cr=t" in lines
    assert "PATH=/bin" in lines  # the image's PATH, not the node's
    assert "HOST-VISIBLE" not in lines and "wrote" in lines
    assert logs["stderr"] == "to-stderr\n"
    assert (Path(work) / "written").exists()
    shown = CliRunner().invoke(app, ["show", job_id], env=env)
    assert IMAGE in shown.stdout


def test_an_image_jobs_exit_code_and_podmans_own_errors_are_reported(
    containers: Cluster,
) -> None:
    failing = containers.submit(image=IMAGE, command=["sh", "-c", "exit 3"])
    missing = containers.submit(image="localhost/gpuloom-no-such-image:1", command=["true"])
    no_program = containers.submit(image=IMAGE, command=["no-such-program"])
    jobs = containers.wait_final([failing, missing, no_program], timeout=60)
    assert (jobs[failing]["state"], jobs[failing]["exit_code"]) == ("failed", 3)
    assert jobs[missing]["state"] == "failed"
    assert jobs[missing]["exit_code"] == 125
    assert jobs[missing]["reason"].startswith("podman: "), jobs[missing]
    assert "gpuloom-no-such-image" in jobs[missing]["reason"]
    assert jobs[no_program]["state"] == "failed" and jobs[no_program]["exit_code"] == 127
    assert "no-such-program" in jobs[no_program]["reason"], jobs[no_program]


def test_cancel_stops_the_container_and_removes_it(
    containers: Cluster, podman_env: dict[str, str]
) -> None:
    job_id = containers.submit(image=IMAGE, command=["sleep", "300"])
    containers.wait_state([job_id], "running", timeout=30)
    folder = run_folder(containers, job_id)
    deadline = time.monotonic() + 15
    while not (folder / "cid").exists() or not containers_of(job_id, podman_env):
        assert time.monotonic() < deadline, "no container started"
        time.sleep(0.1)
    name = (folder / "container").read_text().splitlines()[0]
    pid = int(podman("inspect", "--format={{.State.Pid}}", name, env=podman_env))
    # the memory watch finds a GPU process's job by its container
    assert container_of(pid) == (folder / "cid").read_text().strip()

    answer = containers.http.delete(f"/v1/jobs/{job_id}")
    assert answer.status_code == 202, answer.text
    job = containers.wait_final([job_id], timeout=30)[job_id]
    assert job["state"] == "cancelled", job
    wait_gone(job_id, podman_env)


def test_a_time_limit_kills_a_container_that_ignores_sigterm(
    containers: Cluster, podman_env: dict[str, str]
) -> None:
    stubborn = ["sh", "-c", "trap '' TERM; while :; do sleep 1; done"]
    begun = time.monotonic()
    job_id = containers.submit(image=IMAGE, command=stubborn, time_limit_s=2)
    job = containers.wait_final([job_id], timeout=60)[job_id]
    assert job["state"] == "timed_out", job
    assert time.monotonic() - begun < 40
    wait_gone(job_id, podman_env)


def test_a_container_job_outlives_a_kill_9_of_its_agent(containers: Cluster) -> None:
    job_id = containers.submit(image=IMAGE, command=["sh", "-c", "sleep 4; echo survived"])
    containers.wait_state([job_id], "running", timeout=30)
    assert containers.stack is not None
    containers.stack.kill("agent-c")  # SIGKILL: the shim and podman's client run on
    containers.stack.restart("agent-c")
    job = containers.wait_final([job_id], timeout=60)[job_id]
    assert job["state"] == "succeeded", job
    assert containers.http.get(f"/v1/jobs/{job_id}/logs").json()["stdout"] == "survived\n"

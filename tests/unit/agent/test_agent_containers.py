"""How the agent runs a job that names an image: podman's argv, the env file, the
errors it reports, finding podman, and the memory watch of container processes.
(tests/integration/test_containers.py runs real containers.)"""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path

import pytest

from gpuloom.events import JobSpec, SliceRef
from services.agent.containers import (
    ContainerError,
    Podman,
    cdi_gpus_declared,
    container_environment,
    container_launcher,
    container_name,
    env_file_problem,
    find_podman,
    podman_failure,
    read_container_file,
)
from services.agent.gpuwatch import Limit, over_limit
from services.agent.identity import Account
from services.agent.outcomes import NotStarted
from services.agent.reconcile import Ensure
from services.agent.runner import Runner
from services.agent.shim import RunDir

NOBODY = Account("nobody", 65534, 65534, (65534, 100))


def image_job(gpus: int = 2, milli: int | None = None, **spec: object) -> Ensure:
    fields: dict[str, object] = {
        "name": "j",
        "user": "ann",
        "account": "research",
        "command": ["python", "train.py", "--lr", "0.1"],
        "gpus": gpus,
        "gpu_milli": milli,
        "image": "registry.example.com:5000/team/train:v3",
        **spec,
    }
    pieces = tuple(
        SliceRef(node="node-a", index=i, uuid=f"GPU-{i}", milli=milli or 1000, memory_mib=100)
        for i in range(gpus)
    )
    return Ensure(
        job_id="j1",
        attempt=2,
        node="node-a",
        phase="placed",
        spec=JobSpec.model_validate(fields),
        gpu_indexes=tuple(range(gpus)),
        gpu_uuids=tuple(p.uuid for p in pieces),
        started_at=None,
        slices=pieces,
        replica=1,
    )


def test_the_container_runs_as_the_jobs_account_with_nothing_more(tmp_path: Path) -> None:
    run = RunDir(tmp_path, "node-a", "j1", 2, 1)
    run.create()
    podman = Podman("/usr/bin/podman", "never", gpu_devices=True, environ={"PATH": "/usr/bin"})
    argv = container_launcher(podman, run, image_job(), NOBODY, {"A": "1"})
    image_at = argv.index("registry.example.com:5000/team/train:v3")
    options, command = argv[:image_at], argv[image_at + 1 :]
    assert command == ["python", "train.py", "--lr", "0.1"]  # after the image: never options
    assert options[:3] == ["/usr/bin/podman", "run", "--rm"]
    name = "gpuloom-node-a-j1-2-r1"
    assert container_name("node-a", "j1", 2, 1) == name
    for expected in (
        f"--name={name}",
        "--pull=never",
        "--user=65534:65534",
        "--group-add=100",
        "--network=host",
        "--init",
        "--cap-drop=all",
        "--security-opt=no-new-privileges",
        f"--env-file={run.path / 'env'}",
        f"--volume={run.work}:{run.work}",
        f"--workdir={run.work}",
        "--device=nvidia.com/gpu=GPU-0",
        "--device=nvidia.com/gpu=GPU-1",
        "--label=gpuloom.job=j1",
    ):
        assert expected in options, expected
    assert "--group-add=65534" not in options  # the primary group is not added twice
    assert not any(o.startswith(("--privileged", "--cap-add", "-e", "--env=")) for o in options)
    assert read_container_file(run) == (name, "python")
    env_file = run.file("env")
    assert env_file.read_text() == "A=1\n"
    assert stat.S_IMODE(env_file.stat().st_mode) == 0o600  # values may be secrets


def test_the_container_is_held_to_the_jobs_memory_cpu_and_the_pids_limit(tmp_path: Path) -> None:
    run = RunDir(tmp_path, "node-a", "j1", 2, 1)
    run.create()
    job = image_job()
    sized = replace(job, spec=job.spec.model_copy(update={"memory_mib": 512, "cpu_milli": 1500}))
    argv = container_launcher(Podman("podman", max_pids=100), run, sized, NOBODY, {})
    assert {"--memory=512m", "--cpus=1.5", "--pids-limit=100"} <= set(argv)
    unsized = container_launcher(Podman("podman"), run, job, NOBODY, {})
    assert "--pids-limit=-1" in unsized
    assert not any(a.startswith(("--memory", "--cpus")) for a in unsized)


def test_simulated_gpus_are_not_passed_as_devices(tmp_path: Path) -> None:
    run = RunDir(tmp_path, "node-a", "j1", 2, 1)
    run.create()
    argv = container_launcher(Podman("podman"), run, image_job(), NOBODY, {})
    assert not any(a.startswith("--device") for a in argv)


def test_the_container_keeps_the_images_path_unless_the_job_sets_one() -> None:
    host = "/usr/local/bin:/usr/bin:/bin"
    env = {"PATH": host, "TMPDIR": "/scratch", "HOME": "/w", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert container_environment(env, host) == {"HOME": "/w", "CUDA_VISIBLE_DEVICES": "2,3"}
    assert container_environment({**env, "PATH": "/opt/conda/bin"}, host)["PATH"] == (
        "/opt/conda/bin"
    )


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"A": "x\ny"}, "a line break in env 'A'"),
        ({"A": "x\r"}, "a line break in env 'A'"),
        ({"A B": "x"}, "env name 'A B' cannot go into"),
        ({"#A": "x"}, "env name '#A' cannot go into"),
        ({"A*": "x"}, "env name 'A*' cannot go into"),
        ({"A": "x" * 70_000}, "over podman's 64 KiB"),
    ],
)
def test_what_an_env_file_cannot_carry_is_refused_by_name(
    env: dict[str, str], problem: str
) -> None:
    found = env_file_problem(env)
    assert found is not None and problem in found
    assert "x\ny" not in found  # never the value


def test_an_env_file_takes_what_podman_reads_back_unchanged() -> None:
    assert env_file_problem({"A": " spaced = value ", "B": "", "C": "#not a comment"}) is None


def stderr_with(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "stderr"
    path.write_text(text)
    return path


def test_podmans_own_errors_and_a_missing_program_become_the_reason(tmp_path: Path) -> None:
    pulled = "Trying to pull...\nError: localhost/x:1: image not known\n"
    assert podman_failure(125, stderr_with(tmp_path, pulled)) == (
        125,
        "podman: localhost/x:1: image not known",
    )
    init = "ERROR (catatonit:6): failed to exec pid1: No such file or directory\n"
    assert podman_failure(1, stderr_with(tmp_path, init), "train") == (
        127,
        "cannot run command: train: No such file or directory",
    )
    denied = "ERROR (catatonit:6): failed to exec pid1: Permission denied\n"
    assert podman_failure(1, stderr_with(tmp_path, denied), "train")[0] == 126  # type: ignore[index]
    # the job's own failures are the job's
    assert podman_failure(1, stderr_with(tmp_path, "Traceback ...\nValueError: x\n")) is None
    assert podman_failure(3, stderr_with(tmp_path, "Error: mine\n")) is None
    assert podman_failure(125, tmp_path / "missing") is None


def fake_podman(folder: Path, works: bool = True) -> Path:
    folder.mkdir(exist_ok=True)
    program = folder / "podman"
    program.write_text(f"#!/bin/sh\nexit {0 if works else 1}\n")
    program.chmod(0o755)
    return folder


def test_podman_is_found_on_path_and_keeps_its_configuration(tmp_path: Path) -> None:
    bin_dir = fake_podman(tmp_path / "bin")
    environ = {"PATH": str(bin_dir), "CONTAINERS_CONF": "/etc/x.conf", "LD_PRELOAD": "evil.so"}
    podman = find_podman("auto", "missing", real_gpus=False, environ=environ)
    assert podman is not None and podman.path == str(bin_dir / "podman")
    assert dict(podman.environ) == {"PATH": str(bin_dir), "CONTAINERS_CONF": "/etc/x.conf"}
    assert find_podman("off", "missing", real_gpus=False, environ=environ) is None


def test_without_podman_auto_serves_no_images_and_podman_refuses_to_start(
    tmp_path: Path,
) -> None:
    empty = {"PATH": str(tmp_path)}
    assert find_podman("auto", "missing", real_gpus=False, environ=empty) is None
    with pytest.raises(ContainerError, match="not installed"):
        find_podman("podman", "missing", real_gpus=False, environ=empty)
    broken = {"PATH": str(fake_podman(tmp_path / "bin", works=False))}
    with pytest.raises(ContainerError, match="--version"):
        find_podman("podman", "missing", real_gpus=False, environ=broken)


def test_real_gpus_need_a_cdi_spec_of_them(tmp_path: Path) -> None:
    environ = {"PATH": str(fake_podman(tmp_path / "bin"))}
    cdi = tmp_path / "cdi"
    cdi.mkdir()
    assert find_podman("auto", "missing", real_gpus=True, environ=environ, cdi_dirs=[cdi]) is None
    with pytest.raises(ContainerError, match="nvidia-ctk cdi generate"):
        find_podman("podman", "missing", real_gpus=True, environ=environ, cdi_dirs=[cdi])
    (cdi / "nvidia.yaml").write_text('cdiVersion: 0.5.0\nkind: "nvidia.com/gpu"\ndevices: []\n')
    assert cdi_gpus_declared([cdi])
    podman = find_podman("auto", "missing", real_gpus=True, environ=environ, cdi_dirs=[cdi])
    assert podman is not None and podman.gpu_devices


def test_an_image_job_on_a_node_without_podman_fails_with_a_reason(tmp_path: Path) -> None:
    runner = Runner(tmp_path, lambda exited: None, accounts=None)
    found = runner.ensure(image_job(0))
    assert isinstance(found, NotStarted)
    assert found.ended.reason == (
        "could not start: this node has no container runtime for "
        "registry.example.com:5000/team/train:v3"
    )
    assert not RunDir(tmp_path, "node-a", "j1", 2, 1).exists()


def test_the_memory_watch_counts_a_containers_processes_for_its_job() -> None:
    cid = "c" * 64
    limits = {("j1", 1, 0): Limit(500, {"GPU-a": 1000}, container=cid)}
    usage = {7001: {"GPU-a": 700}, 7002: {"GPU-a": 600}, 8000: {"GPU-a": 5000}}
    # the container's processes are in groups of their own, not the shim's (500)
    found = over_limit(usage, limits, {7001: 7001, 7002: 7001, 8000: 500}, {7001: cid, 7002: cid})
    assert found == {("j1", 1, 0): "GpuMemoryExceeded: 1300 MiB used on GPU GPU-a, "
                     "the slice allows 1000 MiB"}  # fmt: skip
    assert over_limit({7001: {"GPU-a": 700}}, limits, {7001: 7001}, {7001: cid}) == {}


def test_the_env_file_is_not_readable_by_the_job(tmp_path: Path) -> None:
    run = RunDir(tmp_path, "node-a", "j1", 2, 1)
    run.create()
    container_launcher(Podman("podman"), run, image_job(0), NOBODY, {"TOKEN": "secret"})
    assert run.file("env").stat().st_uid == os.getuid()
    assert stat.S_IMODE(run.file("env").stat().st_mode) & 0o077 == 0


def test_a_run_folder_podman_cannot_mount_is_refused_by_name(tmp_path: Path) -> None:
    """podman's --volume is SOURCE:TARGET: a ':' in the job's folder would split it."""
    environ = {"PATH": str(fake_podman(tmp_path / "bin"))}
    odd = tmp_path / "runs:2026"
    with pytest.raises(ContainerError, match=r"runs:2026.*GPULOOM_AGENT_RUN_DIR"):
        find_podman("podman", "missing", real_gpus=False, environ=environ, run_dir=odd)
    assert find_podman("auto", "missing", real_gpus=False, environ=environ, run_dir=odd) is None
    plain = find_podman("auto", "missing", real_gpus=False, environ=environ, run_dir=tmp_path)
    assert plain is not None


def test_a_node_advertises_podman_only_when_it_can_start_a_container(tmp_path: Path) -> None:
    """`podman --version` answers, but the OCI runtime cannot start a container (as runc
    in a sandbox that forbids raising ulimits): `auto` serves no images, rather than a
    node that says it can and fails each image job at its start; `podman` refuses to
    start, saying why and how to fix it."""
    folder = tmp_path / "bin"
    folder.mkdir()
    program = folder / "podman"
    program.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = --version ]; then echo "podman version 4.3.1"; exit 0; fi\n'
        'echo "Error: runc: runc create failed: unable to start container process: '
        "error during container init: error setting rlimit type 7: operation not permitted: "
        'OCI permission denied" >&2\n'
        "exit 126\n"
    )
    program.chmod(0o755)
    environ = {"PATH": str(folder)}
    assert find_podman("auto", "missing", real_gpus=False, environ=environ) is None
    with pytest.raises(ContainerError, match=r"rlimit type 7.*CONTAINERS_CONF"):
        find_podman("podman", "missing", real_gpus=False, environ=environ)

"""The deployment files are checked here, since this machine cannot run them.

There is no Docker engine (nor the compose plugin) here, so `compose.yaml` is
validated against the Compose Specification's JSON schema (the one `docker
compose config` enforces) and for what the stack must contain; the Kubernetes
manifests are parsed and cross-checked with the kustomization and the
services that exist in the repository.
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from gpuloom.client.buscmds import app as buscmds
from gpuloom.devstack import SERVICES as STACK_SERVICES

ROOT = Path(__file__).resolve().parents[3]
#: Every service `make run` starts (`gpuloom.devstack.SERVICES`): compose and Kubernetes
#: run each one too.
SERVICES = list(STACK_SERVICES)


def load_compose() -> dict[str, Any]:
    compose: dict[str, Any] = yaml.safe_load((ROOT / "compose.yaml").read_text())
    return compose


def test_compose_file_follows_the_compose_specification() -> None:
    checker = shutil.which("check-jsonschema") or str(
        Path(sys.executable).parent / "check-jsonschema"
    )
    assert Path(checker).exists(), "check-jsonschema is missing: it is a dev dependency (make venv)"
    result = subprocess.run(
        [checker, "--builtin-schema", "vendor.compose-spec", str(ROOT / "compose.yaml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_runs_the_whole_stack() -> None:
    services = load_compose()["services"]
    for needed in ["nats", "postgres", "jaeger", "migrate", *SERVICES]:
        assert needed in services, f"compose.yaml lacks {needed}"
    agents = [name for name, spec in services.items() if "agent" in served(spec.get("command"))]
    assert len(agents) >= 2, "compose.yaml needs two simulated nodes"
    nats_command = (
        " ".join(services["nats"]["command"])
        if isinstance(services["nats"]["command"], list)
        else services["nats"]["command"]
    )
    assert "-js" in nats_command or "--jetstream" in nats_command


def test_the_gateways_keys_outlive_its_container() -> None:
    """The gateway makes its token and webhook keys in its data directory on first
    start: in the container's own layer, a recreated container (`up --build`) would
    make new ones, and every token and every webhook's sealed secret would be void."""
    compose = load_compose()
    data_dir = "/var/lib/gpuloom"
    assert f"GPULOOM_DATA_DIR={data_dir}" in (ROOT / "Dockerfile").read_text().replace(" ", "")
    mounts = [str(v).split(":") for v in compose["services"]["gateway"].get("volumes", [])]
    named = [source for source, target, *_ in mounts if target == data_dir]
    assert named and named[0] in compose["volumes"], mounts


#: Where compose.yaml's secret files are made at setup time (its header's commands):
#: .gitignored, so absent from a clean clone.
GENERATED = Path(".gpuloom/compose")


def compose_file_references(compose: dict[str, Any]) -> list[tuple[str, Path]]:
    """(who refers, path relative to the repository) for every file or folder of the
    host that compose.yaml names: build contexts and their Dockerfiles, env files, bind
    mounts, and the `file:` of top-level secrets and configs."""
    found: list[tuple[str, Path]] = []
    for name, spec in compose["services"].items():
        build = spec.get("build")
        if build is not None:
            build = {"context": build} if isinstance(build, str) else build
            context = Path(build.get("context", "."))
            dockerfile = context / build.get("dockerfile", "Dockerfile")
            found.append((f"{name}: build context", context))
            found.append((f"{name}: dockerfile", dockerfile))
            found += [
                (f"{name}: command, in the image", path)
                for path in copied_sources(ROOT / dockerfile, context, spec.get("command"))
            ]
        env_files = spec.get("env_file", [])
        for env_file in [env_files] if isinstance(env_files, str | dict) else env_files:
            path = env_file if isinstance(env_file, str) else env_file["path"]
            found.append((f"{name}: env_file", Path(path)))
        for volume in spec.get("volumes", []):
            if isinstance(volume, dict):  # long syntax
                if volume.get("type") == "bind":
                    found.append((f"{name}: bind mount", Path(volume["source"])))
                continue
            source = str(volume).split(":")[0]
            if source.startswith((".", "/", "~")):  # else a named volume
                found.append((f"{name}: bind mount", Path(source)))
    for section in ("secrets", "configs"):
        for name, spec in (compose.get(section) or {}).items():
            if "file" in spec:
                found.append((f"{section}: {name}", Path(spec["file"])))
    return [(who, Path(os.path.normpath(path))) for who, path in found]


def copied_sources(dockerfile: Path, context: Path, command: Any) -> list[Path]:
    """The files of the build context a command names by their place in the image
    (`--inventory /etc/gpuloom/node-a.yaml`, `COPY deploy/inventory /etc/gpuloom`)."""
    if not dockerfile.exists():
        return []  # reported missing itself
    copies = [
        line.split()[1:]
        for line in dockerfile.read_text().splitlines()
        if line.startswith("COPY ") and len(line.split()) == 3
    ]
    words = command if isinstance(command, list) else str(command or "").split()
    return [
        context / source / Path(word).relative_to(target)
        for word in words
        for source, target in copies
        if target.startswith("/") and Path(word).is_relative_to(target) and word != target
    ]


def files_the_compose_setup_makes(workdir: Path) -> set[Path]:
    """Run, in `workdir`, the setup compose.yaml's header gives (`python -m
    gpuloom.client.buscmds ...`), and name what it made; a file the header makes with
    a shell redirection (`> FILE`, the webhook key's `openssl rand`) is named, not run."""
    made: set[Path] = set()
    steps = 0
    for line in (ROOT / "compose.yaml").read_text().splitlines():
        if not line.startswith("#"):
            continue
        command = line.lstrip("# ")
        if command.startswith("python -m gpuloom.client.buscmds "):
            args = shlex.split(command.removeprefix("python -m gpuloom.client.buscmds "))
            result = CliRunner().invoke(buscmds, args, env={"GPULOOM_DATA_DIR": None})
            assert result.exit_code == 0, (
                f"compose.yaml's setup step fails: {command}\n{result.output}"
            )
            steps += 1
        elif redirected := re.search(r">\s*(\S+?)\)?$", command):
            made.add(Path(os.path.normpath(redirected[1])))
            steps += 1
    assert steps > 0, "compose.yaml's header no longer says how to make its secret files"
    return made | {path.relative_to(workdir) for path in workdir.rglob("*") if path.is_file()}


def test_compose_refers_only_to_existing_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every file compose.yaml names exists in the repository, or, under .gpuloom/compose,
    is made by the setup its header gives: a file nothing makes fails here."""
    references = compose_file_references(load_compose())
    assert references, "compose.yaml refers to no file: the parsing above is out of date"
    monkeypatch.chdir(tmp_path)
    made = files_the_compose_setup_makes(tmp_path)
    generated = [(who, path) for who, path in references if path.is_relative_to(GENERATED)]
    assert generated, "compose.yaml mounts no secret from .gpuloom/compose: update this test"
    for who, path in generated:
        assert path in made, f"{who} refers to {path}, which compose.yaml's setup does not make"
    for who, path in references:
        if not path.is_relative_to(GENERATED):
            assert (ROOT / path).exists(), f"{who} refers to missing {path}"


def k8s_documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((ROOT / "deploy" / "kustomization.yaml").read_text())
    documents = []
    for resource in kustomization["resources"]:
        path = ROOT / "deploy" / resource
        assert path.exists(), f"kustomization names missing {resource}"
        documents += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return documents


def test_kubernetes_manifests_cover_every_service() -> None:
    documents = k8s_documents()
    for doc in documents:
        assert {"apiVersion", "kind", "metadata"} <= doc.keys(), doc
    workloads = {
        doc["metadata"]["name"]
        for doc in documents
        if doc["kind"] in {"Deployment", "StatefulSet", "DaemonSet", "Job"}
    }
    for service in [*SERVICES, "nats", "postgres", "jaeger"]:
        assert any(service in name for name in workloads), f"no workload for {service}"
    assert any("agent" in name for name in workloads)


def served(command: Any) -> list[str]:
    """The gpuloom processes a container command starts (`gpuloom serve X`, `-m services.X`)."""
    words = command if isinstance(command, list) else str(command or "").split()
    names = []
    for before, word in itertools.pairwise(words):
        if before == "serve":
            names.append(word)
        elif word.startswith("services."):
            names.append(word.removeprefix("services."))
    return names


def test_every_process_started_by_the_deployments_exists() -> None:
    commands = [spec.get("command") for spec in load_compose()["services"].values()]
    for doc in k8s_documents():
        pod = doc.get("spec", {}).get("template", {}).get("spec", {})
        pod = pod.get("template", {}).get("spec", pod)  # a Job nests a pod template too
        commands += [c.get("command", []) + c.get("args", []) for c in pod.get("containers", [])]
    started = {name for command in commands for name in served(command)}
    assert set(SERVICES) | {"agent"} <= started, started
    for name in started:
        assert (ROOT / "services" / name / "__main__.py").exists(), f"no service {name}"


def test_webhook_delivery_runs_apart_with_its_own_seed_and_the_webhook_key() -> None:
    """Issue #36: the webhooks process is its own container and pod, with its own bus
    identity's seed only, and the key the gateway seals webhook secrets with (it signs
    with them); the gateway and it name the same key."""
    compose = load_compose()
    webhooks, gateway = compose["services"]["webhooks"], compose["services"]["gateway"]
    assert served(webhooks["command"]) == ["webhooks"]
    mounted = {secret["source"]: secret["target"] for secret in webhooks["secrets"]}
    assert mounted == {"webhooks-seed": "nats.seed", "webhook-key": "webhook.key"}
    assert compose["secrets"]["webhooks-seed"]["file"].endswith("/bus/webhooks.seed")
    assert "webhook-key" in {secret["source"] for secret in gateway["secrets"]}
    key = "GPULOOM_WEBHOOK_KEY_FILE"
    assert webhooks["environment"][key] == gateway["environment"][key] == "/run/secrets/webhook.key"
    assert "gateway-data" not in str(webhooks.get("volumes", [])), "no access to the token key"

    pods = {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]
        for doc in k8s_documents()
        if doc["kind"] == "Deployment"
    }
    pod = pods["webhooks"]
    [container] = pod["containers"]
    assert served(container["command"]) == ["webhooks"]
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert volumes["bus"]["secret"]["secretName"] == "gpuloom-bus"
    assert volumes["bus"]["secret"]["items"] == [{"key": "webhooks.seed", "path": "nats.seed"}]
    gateway_volumes = {volume["name"]: volume for volume in pods["gateway"]["volumes"]}
    assert volumes["webhook-key"]["secret"] == gateway_volumes["webhook-key"]["secret"]
    mounts = {mount["name"]: mount["mountPath"] for mount in container["volumeMounts"]}
    env = {variable["name"]: variable.get("value") for variable in container["env"]}
    assert env[key] is not None and env[key].startswith(mounts["webhook-key"] + "/")
    for setting in ("TIMEOUT_S", "MAX_IN_FLIGHT", "MAX_IN_FLIGHT_PER_OWNER", "MAX_BACKLOG"):
        assert f"GPULOOM_WEBHOOK_{setting}" in env, setting


def test_every_service_of_the_stack_runs_in_compose_and_on_kubernetes() -> None:
    """What `make run` starts, compose starts (`gpuloom serve NAME`, its own seed) and
    Kubernetes deploys (a Deployment running it, with its own key of `gpuloom-bus`):
    a service added to the stack alone (as `dispatch` once was) fails here."""
    assert "dispatch" in STACK_SERVICES
    compose = load_compose()
    in_compose = {
        name: served(spec.get("command"))
        for name, spec in compose["services"].items()
        if spec.get("command")
    }
    pods = {
        doc["metadata"]["name"]: doc["spec"]["template"]["spec"]
        for doc in k8s_documents()
        if doc["kind"] == "Deployment"
    }
    for service in STACK_SERVICES:
        assert in_compose.get(service) == [service], f"compose.yaml does not serve {service}"
        assert compose["services"][service]["command"][:2] == ["gpuloom", "serve"], service
        mounted = {s["source"]: s["target"] for s in compose["services"][service]["secrets"]}
        assert mounted.get(f"{service}-seed") == "nats.seed", f"{service} lacks its own seed"
        seed = compose["secrets"][f"{service}-seed"]["file"]
        assert seed == f"./.gpuloom/compose/bus/{service}.seed", seed

        assert service in pods, f"no Deployment for {service} in deploy/"
        [container] = pods[service]["containers"]
        assert served(container["command"]) == [service], container["command"]
        volumes = {volume["name"]: volume for volume in pods[service]["volumes"]}
        bus = volumes["bus"]["secret"]
        assert bus["secretName"] == "gpuloom-bus", service
        assert {"key": f"{service}.seed", "path": "nats.seed"} in bus["items"], service

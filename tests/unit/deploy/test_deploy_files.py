"""The deployment files are checked here, since this machine cannot run them.

There is no Docker engine (nor the compose plugin) here, so `compose.yaml` is
validated against the Compose Specification's JSON schema (the one `docker
compose config` enforces) and for what the stack must contain; the Kubernetes
manifests are parsed and cross-checked with the kustomization and the
services that exist in the repository.
"""

from __future__ import annotations

import itertools
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from gpuloom.devstack import SERVICES as STACK_SERVICES

ROOT = Path(__file__).resolve().parents[3]
#: Every service `make run` starts (`gpuloom.devstack.SERVICES`): compose and Kubernetes
#: run each one too.
SERVICES = list(STACK_SERVICES)


def load_compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "compose.yaml").read_text())


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


def test_compose_refers_only_to_existing_files() -> None:
    compose = load_compose()
    for name, spec in compose["services"].items():
        for volume in spec.get("volumes", []):
            source = str(volume).split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"


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

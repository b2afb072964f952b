"""deploy/k8s/: gpuloom as a Kubernetes cluster's GPU scheduler (docs/kubernetes.md).
The manifests are checked here for what they must hold; the extender and the watcher
themselves run against a real control plane in tests/integration/test_kubernetes.py."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from gpuloom.kube.scheduler_config import scheduler_config_stanza

ROOT = Path(__file__).resolve().parents[3]
K8S = ROOT / "deploy" / "k8s"


def documents() -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    found: list[dict[str, Any]] = []
    for resource in kustomization["resources"]:
        path = K8S / resource
        assert path.exists(), f"kustomization names missing {resource}"
        found += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return found


def named(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in documents() if d["kind"] == kind}


def test_the_extender_the_watcher_and_the_device_plugin_run_with_their_own_identities() -> None:
    deployments = named("Deployment")
    for service in ("extender", "kubewatch"):
        pod = deployments[service]["spec"]["template"]["spec"]
        [container] = pod["containers"]
        assert container["command"] == ["gpuloom", "serve", service]
        assert (ROOT / "services" / service / "__main__.py").exists()
        bus = {v["name"]: v for v in pod["volumes"]}["bus"]["secret"]
        assert bus["items"] == [{"key": f"{service}.seed", "path": "nats.seed"}]
        assert pod["serviceAccountName"] == f"gpuloom-{service}"
        assert pod["securityContext"]["runAsNonRoot"] is True
    [plugin] = named("DaemonSet").values()
    [container] = plugin["spec"]["template"]["spec"]["containers"]
    assert container["command"] == ["python", "-m", "services.deviceplugin"]
    assert (ROOT / "services" / "deviceplugin" / "__main__.py").exists()


def test_the_extender_listens_beyond_loopback_only_with_mutual_tls() -> None:
    [container] = named("Deployment")["extender"]["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPULOOM_EXTENDER_HOST"] == "0.0.0.0"
    for setting in ("CERT", "KEY", "CLIENT_CA"):
        assert env[f"GPULOOM_EXTENDER_TLS_{setting}"], setting
    assert "gpuloom-extender" in named("NetworkPolicy")


def test_each_role_grants_only_what_its_code_calls() -> None:
    roles = {name: role["rules"] for name, role in named("ClusterRole").items()}
    granted = {
        name: {(res, verb) for rule in rules for res in rule["resources"] for verb in rule["verbs"]}
        for name, rules in roles.items()
    }
    assert granted["gpuloom-extender"] == {
        ("pods", "get"),
        ("pods", "list"),
        ("pods", "patch"),
        ("pods/binding", "create"),
        ("events", "create"),
    }
    assert ("nodes", "patch") not in granted["gpuloom-kubewatch"], "the watcher never edits a Node"
    assert ("pods/eviction", "create") in granted["gpuloom-kubewatch"]
    for name, pairs in granted.items():
        assert not any(res == "secrets" for res, _ in pairs), f"{name} reads no secret"
        assert not any(verb in ("*", "escalate", "bind") for _, verb in pairs), name


def test_the_scheduler_configurations_send_gpu_pods_to_the_extender_as_make_run_says() -> None:
    printed = yaml.safe_load(scheduler_config_stanza("http://127.0.0.1:8090/scheduler"))
    [banner] = printed["extenders"]
    for version in ("v1", "v1beta1"):
        doc = yaml.safe_load((K8S / f"scheduler-config-{version}.yaml").read_text())
        assert doc["apiVersion"] == f"kubescheduler.config.k8s.io/{version}"
        [extender] = doc["extenders"]
        assert extender["urlPrefix"].startswith("https://")
        assert extender["enableHTTPS"] is True and set(extender["tlsConfig"]) >= {
            "certFile",
            "keyFile",
            "caFile",
        }
        same = {
            k: v for k, v in extender.items() if k not in ("urlPrefix", "enableHTTPS", "tlsConfig")
        }
        assert same == {k: v for k, v in banner.items() if k != "urlPrefix"}
        assert extender["managedResources"] == [
            {"name": "gpuloom.io/gpu", "ignoredByScheduler": True}
        ]
        assert extender["ignorable"] is False

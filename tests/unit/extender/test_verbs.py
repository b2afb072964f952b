"""The extender's HTTP face (services.extender): what kube-scheduler sends, and what a
hostile caller sends, answered without a crash; and the listener it refuses to open. The
answers themselves are gpuloom.kube.extender's (tests/unit/kube); the whole extender runs
against a real kube-scheduler in tests/integration/test_kubernetes.py."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from gpuloom.config import Settings
from gpuloom.events import Decision, JobSubmitted
from gpuloom.state import ClusterState
from gpuloom.testing.builders import LogBuilder
from services.extender.__main__ import OpenToAll, listening
from services.extender.verbs import Extender, TokenBucket, app


@dataclass
class Folding:
    """What the verbs read of the extender's Reactor: its state, whether it caught up,
    and its publish (recorded here, nothing is sent)."""

    state: ClusterState
    caught_up: asyncio.Event = field(default_factory=asyncio.Event)
    published: list[Decision] = field(default_factory=list)

    async def publish(self, decisions: Sequence[Decision]) -> int:
        self.published.extend(decisions)
        return 1


class NoApi:
    """The Kubernetes API, unreachable in a unit test: no verb here may need it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API was called: {name}")


def pod(annotations: dict[str, str] | None = None, gpus: str = "1") -> dict[str, Any]:
    return {
        "metadata": {
            "name": "train",
            "namespace": "team-a",
            "uid": "5d3c2b1a-0000-4000-8000-000000000001",
            "creationTimestamp": "2026-12-07T10:00:00Z",
            "annotations": annotations or {},
        },
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": {"gpuloom.io/gpu": gpus}}}]
        },
    }


def client(caught_up: bool = True) -> tuple[TestClient, Folding]:
    log = LogBuilder()
    folding = Folding(log.state())
    if caught_up:
        folding.caught_up.set()
    extender = Extender(
        folding, NoApi(), pods=_Pods(), account="default", submits=TokenBucket(0.01, 5)
    )  # type: ignore[arg-type]
    extender._tell = lambda pod, answer: None  # type: ignore[method-assign]
    return TestClient(app(extender)), folding


class _Pods:
    most = 100

    def remember(self, pod: Any) -> None:
        pass

    async def gang(self, pod: Any) -> None:
        return None

    async def exists(self, pod: Any) -> bool:
        return not pod.name.startswith("forged")


def test_a_new_pod_is_submitted_once_and_fails_every_node_until_placed() -> None:
    web, folding = client()
    body = {"Pod": pod({"gpuloom.io/model": "H100"}), "NodeNames": ["n1", "n2"]}
    answer = web.post("/scheduler/filter", json=body).json()
    assert answer["NodeNames"] == [] and set(answer["FailedNodes"]) == {"n1", "n2"}
    assert "submitted" in answer["FailedNodes"]["n1"] and answer["Error"] == ""
    [decision] = folding.published
    assert isinstance(decision.event, JobSubmitted)
    assert decision.event.spec.kubernetes is not None
    assert decision.event.spec.gpu_model == ["H100"] and decision.event.spec.user == "team-a"
    assert decision.msg_id == "submit:k8s:5d3c2b1a-0000-4000-8000-000000000001"


def test_a_pod_that_is_not_in_the_api_is_not_submitted() -> None:
    web, folding = client()
    doc = pod()
    doc["metadata"]["name"] = "forged"
    answer = web.post("/scheduler/filter", json={"Pod": doc, "NodeNames": ["n1"]}).json()
    assert "is not in the Kubernetes API" in answer["FailedNodes"]["n1"]
    assert folding.published == []


def test_a_bad_annotation_is_the_pod_s_reason_and_nothing_is_submitted() -> None:
    web, folding = client()
    body = {"Pod": pod({"gpuloom.io/gpu-milli": "2000"}), "NodeNames": ["n1"]}
    answer = web.post("/scheduler/filter", json=body).json()
    assert "gpuloom.io/gpu-milli" in answer["FailedNodes"]["n1"]
    assert folding.published == []
    answer = web.post(
        "/scheduler/filter", json={"Pod": pod(gpus="500m"), "NodeNames": ["n1"]}
    ).json()
    assert "whole number" in answer["FailedNodes"]["n1"]


@pytest.mark.parametrize(
    "body",
    [b"not json", b"[1, 2]", b'{"Pod": 5}', b'{"Pod": {"metadata": []}}', b"{}"],
)
def test_what_kube_scheduler_never_sends_gets_an_error_not_a_crash(body: bytes) -> None:
    web, _ = client()
    for verb in ("filter", "prioritize", "bind"):
        response = web.post(f"/scheduler/{verb}", content=body)
        assert response.status_code in (200, 400), response.text
        if response.status_code == 400 or verb != "prioritize":
            assert response.json()["Error"], (verb, body)


def test_it_answers_nothing_before_it_read_the_log() -> None:
    web, _ = client(caught_up=False)
    response = web.post("/scheduler/filter", json={"Pod": pod(), "NodeNames": ["n1"]})
    assert response.status_code == 503 and "reading the log" in response.json()["Error"]


def test_new_pods_beyond_the_budget_wait_for_a_later_try() -> None:
    web, folding = client()
    for n in range(8):
        doc = pod()
        doc["metadata"]["uid"] = f"5d3c2b1a-0000-4000-8000-00000000001{n}"
        web.post("/scheduler/filter", json={"Pod": doc, "NodeNames": ["n1"]})
    assert len(folding.published) == 5, "a burst of 5, then none until tokens return"


def test_the_extender_refuses_to_listen_beyond_loopback_without_mutual_tls(tmp_path: Path) -> None:
    assert listening(Settings(extender_host="127.0.0.1"))["host"] == "127.0.0.1"
    with pytest.raises(OpenToAll, match="without mutual TLS"):
        listening(Settings(extender_host="0.0.0.0"))
    with pytest.raises(OpenToAll, match="together"):
        listening(Settings(extender_host="0.0.0.0", extender_tls_cert=tmp_path / "c"))
    files = {f"extender_tls_{k}": tmp_path / k for k in ("cert", "key", "client_ca")}
    options = listening(Settings(extender_host="0.0.0.0", **files))  # type: ignore[arg-type]
    assert options["ssl_cert_reqs"] == 2 and options["ssl_ca_certs"] == str(tmp_path / "client_ca")

"""What the gateway refuses at submission (422 naming the field) is what admission
would reject for lack of any node: `resources_problem` answers both."""

from __future__ import annotations

import pytest

from gpuloom.decide.admission import rejection_reason, resources_problem
from gpuloom.decide.explain import reason_text
from gpuloom.events import JobSpec, NodeRegistered
from gpuloom.events.jobs import KubernetesPods
from gpuloom.placement.filters import refusal
from gpuloom.placement.inputs import node_views, request_of
from gpuloom.placement.resources import host_fits
from gpuloom.state import ClusterState
from gpuloom.testing.builders import LogBuilder, make_job_spec, make_node_spec


def cluster() -> LogBuilder:
    """n1: 4 x A100-80GB, n2: 2 x A100-80GB."""
    log = LogBuilder()
    log.register("n1", 4, "A100-80GB")
    log.register("n2", 2, "A100-80GB")
    return log


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        (make_job_spec(1, gpu_model=["B200"]), "gpu_model"),
        (make_job_spec(5), "gpus"),
        (make_job_spec(1, pool="vgpu"), "pool"),
        (make_job_spec(1, gpu_milli=500), "gpu_milli"),
        (make_job_spec(2, replicas=4), "replicas"),  # 3 pairs in all: 4 never fit at once
        (make_job_spec(0, cpu_milli=10**9), None),
    ],
)
def test_the_field_at_fault_is_named_and_admission_gives_the_same_reason(
    spec: JobSpec, field: str | None
) -> None:
    state = cluster().state()
    found = resources_problem(state, spec)
    assert found is not None and found[0] == field
    assert rejection_reason(state, spec) == found[1]


@pytest.mark.parametrize("spec", [make_job_spec(4), make_job_spec(2, replicas=3), make_job_spec(0)])
def test_what_some_node_could_run_passes(spec: JobSpec) -> None:
    assert resources_problem(cluster().state(), spec) is None


def test_an_empty_cluster_has_no_node() -> None:
    assert resources_problem(ClusterState(), make_job_spec(1)) == (None, "no node is registered")


def test_a_reason_says_its_code_once() -> None:
    assert reason_text("Dependency", "Dependency: waiting for a to succeed") == (
        "Dependency: waiting for a to succeed"
    )
    assert reason_text("Resources", "no node has room for it now") == (
        "Resources: no node has room for it now"
    )
    assert reason_text(None, "ended") == "ended" and reason_text("Held", None) == "Held"


def with_podman(log: LogBuilder, name: str) -> LogBuilder:
    """Register `name` (2 x A100-80GB) as a node whose agent found podman."""
    spec = make_node_spec(name, 2, "A100-80GB").model_copy(update={"runtimes": ["podman"]})
    log.append(NodeRegistered(node=name, spec=spec))
    return log


def test_an_image_needs_a_node_with_a_container_runtime() -> None:
    spec = make_job_spec(1, image="localhost/train:v1")
    state = cluster().state()
    assert resources_problem(state, spec) == (
        "image",
        "no node has a container runtime (podman) to run an image",
    )
    assert rejection_reason(state, spec) == resources_problem(state, spec)[1]  # type: ignore[index]
    assert resources_problem(with_podman(cluster(), "n3").state(), spec) is None
    # a runtime on a node too small for the job: the GPUs are at fault, not the image
    assert (
        resources_problem(
            with_podman(cluster(), "n3").state(), make_job_spec(3, image="localhost/train:v1")
        )
        is not None
    )


def test_placement_and_the_fold_keep_an_image_off_nodes_without_a_runtime() -> None:
    log = with_podman(cluster(), "n3")
    log.submit("j1", make_job_spec(1, image="localhost/train:v1"))
    state = log.state()
    request = request_of(state.jobs["j1"].spec)
    views = {view.name: view for view in node_views(state)}
    assert not host_fits(request, views["n1"]) and host_fits(request, views["n3"])
    assert refusal(request, views["n1"]) == (
        "runtime: the node has no container runtime to run the job's image"
    )
    assert refusal(request_of(make_job_spec(1)), views["n1"]) is None  # a plain process
    log.admit("j1")
    log.queue("j1")
    log.place("j1", "n1", [0])  # a writer that ignored the rule: the fold voids it
    assert log.state().jobs["j1"].phase == "queued"
    log.place("j1", "n3", [0])
    assert log.state().jobs["j1"].phase == "placed"


def kubernetes_cluster() -> LogBuilder:
    """k1: 2 x H100, a Kubernetes node (docs/kubernetes.md)."""
    log = LogBuilder()
    spec = make_node_spec("k1", 2, "H100").model_copy(update={"runtimes": ["kubernetes"]})
    log.append(NodeRegistered(node="k1", spec=spec))
    return log


def pod_spec(gpus: int, **kw: object) -> JobSpec:
    pods = KubernetesPods(namespace="team-a", name="train", uid="0f8b-11")
    return make_job_spec(gpus, **kw).model_copy(update={"kubernetes": pods})


def test_a_rest_job_on_a_cluster_of_kubernetes_nodes_is_told_to_submit_pods() -> None:
    state = kubernetes_cluster().state()
    found = resources_problem(state, make_job_spec(1))
    assert found is not None and "Kubernetes node, which runs only pods" in found[1]
    assert rejection_reason(state, make_job_spec(1)) == found[1]


def test_a_pod_waits_for_a_node_rather_than_being_rejected() -> None:
    """No node has a B200, none has 5 GPUs, no Kubernetes node at all: a pod still waits
    (one may join), where a REST job would be refused."""
    assert rejection_reason(kubernetes_cluster().state(), pod_spec(1, gpu_model=["B200"])) is None
    assert rejection_reason(kubernetes_cluster().state(), pod_spec(5)) is None
    assert rejection_reason(cluster().state(), pod_spec(1)) is None
    found = resources_problem(cluster().state(), pod_spec(1))
    assert found == ("kubernetes", "no Kubernetes node is registered")


def test_a_pod_fits_only_a_kubernetes_node_and_a_rest_job_only_another() -> None:
    log = cluster()
    spec = make_node_spec("k1", 2, "A100-80GB").model_copy(update={"runtimes": ["kubernetes"]})
    log.append(NodeRegistered(node="k1", spec=spec))
    views = {v.name: v for v in node_views(log.state())}
    pod, job = request_of(pod_spec(1)), request_of(make_job_spec(1))
    assert [name for name, v in sorted(views.items()) if host_fits(pod, v)] == ["k1"]
    assert [name for name, v in sorted(views.items()) if host_fits(job, v)] == ["n1", "n2"]
    assert refusal(pod, views["n1"]) is not None and "Kubernetes" in str(refusal(pod, views["n1"]))
    assert "runs only pods" in str(refusal(job, views["k1"]))

"""A pod as gpuloom reads it (`read_pod`), the job it becomes (`job_spec`), its job's id
and idempotency key: every annotation a pod's author writes is checked, and a bad one is
a `PodProblem` naming it, never an exception."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ulid import ULID

from gpuloom.events import JobSpec
from gpuloom.events.jobs import KubernetesPods, TopologyRequest
from gpuloom.kube.pods import (
    ANNOTATION_MOST,
    Pod,
    PodDefaults,
    PodProblem,
    job_id,
    job_spec,
    read_pod,
)
from gpuloom.kube.vocabulary import (
    ACCOUNT,
    ASKED,
    GANG,
    GPU_MILLI,
    GPU_RESOURCE,
    LOCALITY,
    MODEL,
    POOL,
    PREEMPTIBLE,
    PRIORITY_CLASS,
    REPLICAS,
    TIME_LIMIT,
    TOPOLOGY,
    WRITTEN,
)

from .kubeworld import pod_obj, uid_of

UID = uid_of(1)
DEFAULTS = PodDefaults(
    account="shared",
    classes=frozenset({"high", "normal", "low"}),
    default_class="normal",
    priorities=(("high", 100), ("normal", 10), ("low", 1)),
)


def pod(gpus: int = 1, uid: str = UID, name: str = "train-0", **annotations: str) -> Pod:
    return Pod("team-a", name, uid, gpus, annotations=dict(annotations))


def spec_of(p: Pod, defaults: PodDefaults = DEFAULTS) -> JobSpec:
    found = job_spec(p, defaults)
    assert isinstance(found, JobSpec), found
    return found


def problem_of(p: Pod, defaults: PodDefaults = DEFAULTS) -> PodProblem:
    found = job_spec(p, defaults)
    assert isinstance(found, PodProblem), found
    return found


def with_containers(*containers: dict[str, Any]) -> dict[str, Any]:
    obj = pod_obj("train-0", UID, None)
    obj["spec"]["containers"] = list(containers)
    return obj


def container(
    name: str, limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None
) -> dict[str, Any]:
    resources: dict[str, Any] = {}
    if limits is not None:
        resources["limits"] = limits
    if requests is not None:
        resources["requests"] = requests
    return {"name": name, "image": "pytorch", "resources": resources}


# --- read_pod ---------------------------------------------------------------------------


def test_a_pod_that_asks_for_no_gpuloom_gpu_is_not_gpuloom_s() -> None:
    assert read_pod(pod_obj("web", UID, None)) is None
    assert read_pod(with_containers(container("c", {"nvidia.com/gpu": "1"}))) is None


def test_an_object_that_is_not_a_pod_reads_as_none() -> None:
    assert read_pod({}) is None
    assert read_pod({"metadata": "x", "spec": {}, "status": {}}) is None


def test_a_realistic_pod_is_read_with_every_field_gpuloom_needs() -> None:
    obj = pod_obj(
        "train-0",
        UID,
        2,
        annotations={POOL: "physical"},
        node="node-a.example",
        phase="Running",
        owner_uid="owner-1",
    )
    obj["spec"]["priorityClassName"] = "high"
    found = read_pod(obj)
    assert found == Pod(
        namespace="team-a",
        name="train-0",
        uid=UID,
        gpus=2,
        annotations={POOL: "physical"},
        created=datetime(2025, 1, 1, 12, 0, tzinfo=UTC),
        node_name="node-a.example",
        phase="Running",
        exit_code=None,
        deleting=False,
        priority_class_name="high",
        owner_uid="owner-1",
        problem=None,
    )
    assert not found.ended and found.gang is None


def test_the_gpus_are_summed_over_every_container() -> None:
    obj = with_containers(
        container("a", {GPU_RESOURCE: "2", "cpu": "1"}),
        container("sidecar", {"cpu": "100m"}),
        container("b", {GPU_RESOURCE: 3}),
    )
    found = read_pod(obj)
    assert found is not None and found.gpus == 5 and found.problem is None


def test_a_container_that_only_requests_gpus_counts_its_request() -> None:
    obj = with_containers(container("a", {"cpu": "1"}, {GPU_RESOURCE: "2", "cpu": "1"}))
    found = read_pod(obj)
    assert found is not None and found.gpus == 2


def test_a_limit_wins_over_a_request_of_the_same_container() -> None:
    obj = with_containers(container("a", {GPU_RESOURCE: "4"}, {GPU_RESOURCE: "3"}))
    found = read_pod(obj)
    assert found is not None and found.gpus == 4


@pytest.mark.parametrize("limit", ["500m", "1.5", "-1", "1e3", "two", "12345"])
def test_a_limit_that_is_not_a_whole_count_is_a_problem_naming_the_container(limit: str) -> None:
    obj = with_containers(
        container("ok", {GPU_RESOURCE: "1"}), container("worker", {GPU_RESOURCE: limit})
    )
    found = read_pod(obj)
    assert found is not None and found.problem is not None
    assert "worker" in found.problem.field
    assert GPU_RESOURCE in found.problem.reason and repr(limit) in found.problem.reason
    assert job_spec(found, DEFAULTS) == found.problem, "the problem is the pod's answer"


def test_the_exit_code_is_the_first_that_is_not_zero() -> None:
    found = read_pod(pod_obj("p", UID, phase="Failed", exit_codes=[0, 3, 7]))
    assert found is not None and found.exit_code == 3 and found.ended
    done = read_pod(pod_obj("p", UID, phase="Succeeded", exit_codes=[0, 0]))
    assert done is not None and done.exit_code == 0 and done.ended


def test_a_pod_without_ended_containers_has_no_exit_code() -> None:
    obj = pod_obj("p", UID, phase="Running")
    obj["status"]["containerStatuses"] = [{"name": "main", "state": {"running": {}}}]
    found = read_pod(obj)
    assert found is not None and found.exit_code is None


def test_a_deletion_timestamp_means_the_pod_is_being_deleted() -> None:
    found = read_pod(pod_obj("p", UID, deleting=True))
    assert found is not None and found.deleting
    alive = read_pod(pod_obj("p", UID))
    assert alive is not None and not alive.deleting


def test_the_owner_is_the_controller_else_the_first_owner() -> None:
    obj = pod_obj("p", UID)
    obj["metadata"]["ownerReferences"] = [
        {"kind": "ConfigMap", "name": "x", "uid": "first"},
        {"kind": "Job", "name": "j", "uid": "the-controller", "controller": True},
    ]
    found = read_pod(obj)
    assert found is not None and found.owner_uid == "the-controller"
    del obj["metadata"]["ownerReferences"][1]
    only = read_pod(obj)
    assert only is not None and only.owner_uid == "first"
    orphan = read_pod(pod_obj("p", UID))
    assert orphan is not None and orphan.owner_uid == ""


def test_an_unknown_phase_and_a_missing_timestamp_read_as_pending_and_the_epoch() -> None:
    obj = pod_obj("p", UID, phase="Weird")
    del obj["metadata"]["creationTimestamp"]
    found = read_pod(obj)
    assert found is not None
    assert found.phase == "Pending" and found.created == datetime(1970, 1, 1, tzinfo=UTC)


# --- job_spec: each annotation ----------------------------------------------------------


def test_a_pod_that_says_nothing_gets_the_defaults() -> None:
    spec = spec_of(pod(2))
    assert spec.name == "train-0" and spec.user == "team-a" and spec.account == "shared"
    assert spec.gpus == 2 and spec.gpu_milli is None and spec.pool == "any"
    assert spec.locality == "local-only" and spec.gpu_model == [] and spec.replicas == 1
    assert spec.priority_class == "normal" and spec.priority == 10
    assert not spec.preemptible and spec.time_limit_s is None and spec.topology is None
    assert spec.command == ["kubernetes-pod", "team-a/train-0"]
    assert spec.kubernetes == KubernetesPods(namespace="team-a", name="train-0", uid=UID)


def test_a_fraction_of_a_gpu_comes_from_the_vgpu_pool_by_default() -> None:
    spec = spec_of(pod(1, **{GPU_MILLI: "250"}))
    assert spec.gpu_milli == 250 and spec.pool == "vgpu"


@pytest.mark.parametrize("milli", ["0", "1000", "abc", "-5", "2.5", ""])
def test_a_fraction_out_of_range_or_not_a_number_is_refused_naming_the_annotation(
    milli: str,
) -> None:
    found = problem_of(pod(1, **{GPU_MILLI: milli}))
    assert found.field == GPU_MILLI and "1 to 999" in found.reason


def test_the_pool_locality_model_and_account_are_taken_as_asked() -> None:
    spec = spec_of(
        pod(
            1,
            **{
                POOL: "physical",
                LOCALITY: "local-first",
                MODEL: " A100-80GB , H100-80GB,,",
                ACCOUNT: "vision",
            },
        )
    )
    assert spec.pool == "physical" and spec.locality == "local-first"
    assert spec.gpu_model == ["A100-80GB", "H100-80GB"] and spec.account == "vision"


@pytest.mark.parametrize(
    ("name", "value"),
    [(POOL, "any"), (POOL, "gpu"), (LOCALITY, "any"), (LOCALITY, "remote")],
)
def test_a_pool_or_locality_outside_its_choices_is_refused(name: str, value: str) -> None:
    found = problem_of(pod(1, **{name: value}))
    assert found.field == name and repr(value) in found.reason


def test_a_bad_account_is_refused_naming_the_annotation() -> None:
    found = problem_of(pod(1, **{ACCOUNT: "not an account"}))
    assert found.field == ACCOUNT


def test_the_priority_class_annotation_wins_over_the_pod_s_priority_class_name() -> None:
    p = Pod("team-a", "p", UID, 1, annotations={PRIORITY_CLASS: "low"}, priority_class_name="high")
    spec = spec_of(p)
    assert spec.priority_class == "low" and spec.priority == 1


def test_a_known_priority_class_name_is_the_class() -> None:
    spec = spec_of(Pod("team-a", "p", UID, 1, priority_class_name="high"))
    assert spec.priority_class == "high" and spec.priority == 100


def test_an_unknown_priority_class_name_gets_the_default_class() -> None:
    spec = spec_of(Pod("team-a", "p", UID, 1, priority_class_name="system-node-critical"))
    assert spec.priority_class == "normal" and spec.priority == 10


def test_an_unknown_class_in_the_annotation_is_kept_with_priority_zero() -> None:
    # admission judges whether the class exists and who may use it (not the extender)
    spec = spec_of(pod(1, **{PRIORITY_CLASS: "gold"}))
    assert spec.priority_class == "gold" and spec.priority == 0


def test_a_bad_priority_class_is_refused_naming_the_annotation() -> None:
    assert problem_of(pod(1, **{PRIORITY_CLASS: "no spaces please"})).field == PRIORITY_CLASS


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("3600", 3600), ("90s", 90), ("30m", 1800), ("12h", 43200), ("2d", 172800), (" 5m ", 300)],
)
def test_a_time_limit_is_read_in_each_unit(text: str, seconds: int) -> None:
    assert spec_of(pod(1, **{TIME_LIMIT: text})).time_limit_s == seconds


@pytest.mark.parametrize("text", ["", "1.5h", "1w", "h", "-30s", "30 m", "1h30m", "PT1H"])
def test_a_time_limit_that_is_not_a_duration_is_refused(text: str) -> None:
    found = problem_of(pod(1, **{TIME_LIMIT: text}))
    assert found.field == TIME_LIMIT and "duration" in found.reason


@pytest.mark.parametrize("text", ["0", "0s", "0d", "25000d", "999999999d"])
def test_a_time_limit_of_zero_or_past_68_years_is_refused(text: str) -> None:
    found = problem_of(pod(1, **{TIME_LIMIT: text}))
    assert found.field == TIME_LIMIT and "68 years" in found.reason


def test_a_topology_is_required_unless_preferred() -> None:
    assert spec_of(pod(1, **{TOPOLOGY: "rack"})).topology == TopologyRequest(level="rack")
    assert spec_of(pod(1, **{TOPOLOGY: "rack:preferred"})).topology == TopologyRequest(
        level="rack", mode="preferred"
    )
    assert spec_of(pod(1, **{TOPOLOGY: "rack:required"})).topology == TopologyRequest(
        level="rack", mode="required"
    )


def test_a_topology_mode_that_is_not_known_is_refused() -> None:
    found = problem_of(pod(1, **{TOPOLOGY: "rack:maybe"}))
    assert found.field == TOPOLOGY and "rack:maybe" in found.reason


@pytest.mark.parametrize("text", ["Rack!", ":preferred", "a b"])
def test_a_topology_level_that_is_not_a_name_is_refused_naming_the_annotation(text: str) -> None:
    assert problem_of(pod(1, **{TOPOLOGY: text})).field == TOPOLOGY


@pytest.mark.parametrize(("text", "expected"), [("true", True), ("false", False)])
def test_preemptible_is_true_or_false(text: str, expected: bool) -> None:
    assert spec_of(pod(1, **{PREEMPTIBLE: text})).preemptible is expected


@pytest.mark.parametrize("text", ["True", "yes", "1", ""])
def test_preemptible_anything_else_is_refused(text: str) -> None:
    found = problem_of(pod(1, **{PREEMPTIBLE: text}))
    assert found.field == PREEMPTIBLE and "true or false" in found.reason


def test_a_gang_is_one_job_of_its_replicas_named_after_the_gang() -> None:
    spec = spec_of(pod(2, name="trainer-3", **{GANG: "trainer", REPLICAS: "4"}))
    assert spec.replicas == 4 and spec.gpus == 2 and spec.name == "trainer"
    assert spec.command == ["kubernetes-pod", "team-a/trainer"]
    assert spec.kubernetes == KubernetesPods(namespace="team-a", name="trainer", uid=None)
    assert spec.kubernetes is not None and spec.kubernetes.gang


def test_a_gang_without_its_number_of_pods_is_refused() -> None:
    found = problem_of(pod(1, **{GANG: "trainer"}))
    assert found.field == REPLICAS and GANG in found.reason


def test_replicas_without_a_gang_are_refused() -> None:
    found = problem_of(pod(1, **{REPLICAS: "2"}))
    assert found.field == REPLICAS and GANG in found.reason


@pytest.mark.parametrize("replicas", ["0", "1025", "two"])
def test_a_gang_size_out_of_range_is_refused(replicas: str) -> None:
    assert problem_of(pod(1, **{GANG: "g", REPLICAS: replicas})).field == REPLICAS


def test_a_gang_name_that_is_not_a_kubernetes_name_is_refused_naming_the_annotation() -> None:
    assert problem_of(pod(1, **{GANG: "My Gang", REPLICAS: "2"})).field == GANG


def test_an_unknown_gpuloom_annotation_is_refused_naming_it() -> None:
    found = problem_of(pod(1, **{"gpuloom.io/gpu-mili": "500"}))
    assert found.field == "gpuloom.io/gpu-mili" and "unknown annotation" in found.reason


def test_annotations_gpuloom_writes_and_those_of_others_are_not_refused() -> None:
    notes = {name: "x" * 300 for name in WRITTEN} | {"example.com/owner": "y" * 1000}
    assert isinstance(job_spec(pod(1, **notes), DEFAULTS), JobSpec)


@pytest.mark.parametrize("name", ASKED)
def test_an_over_long_annotation_is_refused_naming_it(name: str) -> None:
    found = problem_of(pod(1, **{name: "1" * (ANNOTATION_MOST + 1)}))
    assert found.field == name and str(ANNOTATION_MOST) in found.reason


def test_a_pod_that_asks_for_zero_gpus_is_refused() -> None:
    found = problem_of(pod(0))
    assert found.field == GPU_RESOURCE


def test_a_bad_model_in_any_place_of_the_list_is_refused_naming_the_annotation() -> None:
    assert problem_of(pod(1, **{MODEL: "A100, H100 SXM"})).field == MODEL


def test_a_bad_first_model_is_refused_naming_the_annotation() -> None:
    assert problem_of(pod(1, **{MODEL: "H100 SXM"})).field == MODEL


def test_a_pod_with_a_long_valid_name_becomes_a_job() -> None:
    assert isinstance(job_spec(pod(1, name="a" * 230), DEFAULTS), JobSpec)


# --- job_id and job_key -----------------------------------------------------------------


def created(p: Pod, when: datetime) -> Pod:
    return Pod(p.namespace, p.name, p.uid, p.gpus, created=when)


def test_the_job_id_is_a_deterministic_ulid() -> None:
    p = created(pod(1), datetime(2025, 3, 4, 5, 6, 7, 890000, tzinfo=UTC))
    first = job_id(p)
    assert first == job_id(p) and len(first) == 26
    parsed = ULID.from_str(first)
    assert str(parsed) == first
    assert parsed.datetime == datetime(2025, 3, 4, 5, 6, 7, 890000, tzinfo=UTC)


def test_the_job_id_differs_by_uid() -> None:
    when = datetime(2025, 3, 4, tzinfo=UTC)
    ids = {job_id(created(pod(1, uid=uid_of(n)), when)) for n in range(50)}
    assert len(ids) == 50


def test_job_ids_sort_by_creation_time() -> None:
    start = datetime(2025, 3, 4, tzinfo=UTC)
    pods = [
        created(pod(1, uid=uid_of(99 - n)), start + timedelta(milliseconds=7 * n))
        for n in range(40)
    ]
    ids = [job_id(p) for p in pods]
    assert ids == sorted(ids)


def test_a_lone_pod_s_key_is_its_uid() -> None:
    assert pod(1).job_key == f"k8s:{UID}"
    assert pod(1, uid=uid_of(2)).job_key != pod(1).job_key


def gang_pod(name: str, uid: str, owner: str, gang: str = "trainer") -> Pod:
    return Pod("team-a", name, uid, 1, annotations={GANG: gang, REPLICAS: "2"}, owner_uid=owner)


def test_the_pods_of_one_gang_and_owner_share_their_job_key() -> None:
    first = gang_pod("trainer-0", uid_of(1), "owner-1")
    second = gang_pod("trainer-1", uid_of(2), "owner-1")
    assert first.job_key == second.job_key == "k8s-gang:team-a/trainer/owner-1"


def test_a_gang_made_again_by_a_new_owner_has_a_new_key() -> None:
    assert (
        gang_pod("t-0", uid_of(1), "owner-1").job_key
        != gang_pod("t-0", uid_of(3), "owner-2").job_key
    )
    assert (
        gang_pod("t-0", uid_of(1), "owner-1").job_key
        != gang_pod("t-0", uid_of(1), "owner-1", "other").job_key
    )
    assert gang_pod("t-0", uid_of(1), "").job_key == "k8s-gang:team-a/trainer/-"


# --- nothing a pod says makes job_spec raise --------------------------------------------

ANNOTATION_NAMES = st.one_of(
    st.sampled_from([*ASKED, *WRITTEN]),
    st.text(min_size=0, max_size=12).map(lambda s: "gpuloom.io/" + s),
    st.text(max_size=20),
)
ANNOTATION_VALUES = st.one_of(
    st.text(max_size=300),
    st.sampled_from(["1", "999", "1000", "0", "rack", "rack:preferred", "true", "2d", "vgpu"]),
    st.integers(-5, 2**40).map(str),
)


@settings(max_examples=80, deadline=None)
@given(
    notes=st.dictionaries(ANNOTATION_NAMES, ANNOTATION_VALUES, max_size=8),
    gpus=st.integers(-1, 2000),
    class_name=st.text(max_size=10),
)
def test_job_spec_never_raises_whatever_the_annotations(
    notes: dict[str, str], gpus: int, class_name: str
) -> None:
    p = Pod("team-a", "train-0", UID, gpus, annotations=notes, priority_class_name=class_name)
    found = job_spec(p, DEFAULTS)
    assert isinstance(found, JobSpec | PodProblem)
    if isinstance(found, PodProblem):
        assert found.field and found.reason
    else:
        assert found.kubernetes is not None and found.gpus == gpus


@settings(max_examples=50, deadline=None)
@given(
    limit=st.one_of(st.text(max_size=8), st.integers(-3, 10**6), st.floats(allow_nan=True)),
    phase=st.one_of(st.none(), st.text(max_size=10)),
    created_at=st.one_of(st.none(), st.text(max_size=30)),
)
def test_read_pod_never_raises_on_odd_values(
    limit: object, phase: object, created_at: object
) -> None:
    obj = pod_obj("p", UID, None)
    obj["spec"]["containers"][0]["resources"]["limits"][GPU_RESOURCE] = limit
    obj["status"]["phase"] = phase
    obj["metadata"]["creationTimestamp"] = created_at
    found = read_pod(obj)
    assert found is not None
    whole = re.fullmatch(r"[0-9]{1,4}", str(limit)) is not None
    assert (found.problem is None) == whole
    assert found.gpus == (int(str(limit)) if whole else 0)


def test_a_long_named_gang_made_again_by_a_new_owner_still_has_a_new_key() -> None:
    namespace, gang = "n" * 50, "g" * 150

    def member(owner: str) -> Pod:
        notes = {GANG: gang, REPLICAS: "2"}
        return Pod(namespace, gang + "-0", uid_of(1), 1, annotations=notes, owner_uid=owner)

    assert isinstance(job_spec(member("owner-1"), DEFAULTS), JobSpec), "a valid gang"
    assert member("owner-1").job_key != member("owner-2").job_key

"""Which pod an `Allocate` is for, and what its container gets (the pure matching)."""

from __future__ import annotations

from typing import Any

import pytest

from services.deviceplugin.allocation import (
    Allocation,
    BadPlacement,
    NoMatch,
    Slice,
    choose_pod,
    read_placement,
)

NODE = "gpu-node-1"


def pod(
    name: str,
    gpus: int | list[int] = 1,
    *,
    created: str = "2026-01-01T00:00:00Z",
    namespace: str = "team-a",
    node: str = NODE,
    indices: str = "0",
    uuids: str = "GPU-aaaa",
    job: str = "01JOB",
    phase: str | None = "Pending",
    extra: dict[str, str] | None = None,
    placed: bool = True,
) -> dict[str, Any]:
    """A pod as the API returns it; `gpus` a list gives one container per count."""
    counts = gpus if isinstance(gpus, list) else [gpus]
    annotations = (
        {
            "gpuloom.io/node": node,
            "gpuloom.io/gpus": indices,
            "gpuloom.io/gpu-uuids": uuids,
            "gpuloom.io/job": job,
            "gpuloom.io/attempt": "1",
        }
        if placed
        else {}
    )
    annotations.update(extra or {})
    return {
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": f"uid-{namespace}-{name}",
            "creationTimestamp": created,
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": f"c{i}", "resources": {"limits": {"gpuloom.io/gpu": str(n)}}}
                for i, n in enumerate(counts)
            ]
            + [{"name": "sidecar", "resources": {"limits": {"cpu": "1"}}}],
        },
        "status": {"phase": phase} if phase else {},
    }


def chosen(pods: list[dict[str, Any]], count: int, node: str = NODE) -> Allocation:
    found = choose_pod(pods, count, node)
    assert isinstance(found, Allocation), found
    return found


def test_the_container_gets_gpuloom_gpus() -> None:
    found = chosen([pod("train", 2, indices="1,3", uuids="GPU-b,GPU-d", job="01ABC")], 2)

    assert (found.namespace, found.name, found.containers) == ("team-a", "train", ("c0",))
    assert found.allocated_value == "c0"
    assert found.envs == {
        "NVIDIA_VISIBLE_DEVICES": "GPU-b,GPU-d",
        "GPULOOM_GPUS": "1,3",
        "GPULOOM_GPU_UUIDS": "GPU-b,GPU-d",
        "GPULOOM_JOB_ID": "01ABC",
        "GPULOOM_NODE": NODE,
        "GPULOOM_ATTEMPT": "1",
    }


def test_the_oldest_waiting_pod_wins_whatever_the_order() -> None:
    pods = [
        pod("young", created="2026-01-01T00:00:05Z", uuids="GPU-y"),
        pod("old", created="2026-01-01T00:00:01Z", uuids="GPU-o"),
        pod("middle", created="2026-01-01T00:00:03Z", uuids="GPU-m"),
    ]

    assert chosen(pods, 1).name == "old"
    assert chosen(list(reversed(pods)), 1).name == "old"


def test_the_same_creation_time_is_settled_by_namespace_then_name() -> None:
    pods = [pod("b"), pod("a", namespace="team-b"), pod("c")]

    assert (chosen(pods, 1).namespace, chosen(pods, 1).name) == ("team-a", "b")


def test_only_a_pod_asking_for_that_many_fits() -> None:
    pods = [
        pod("one", 1, created="2026-01-01T00:00:01Z"),
        pod("two", 2, created="2026-01-01T00:00:02Z", indices="0,1", uuids="GPU-a,GPU-b"),
        pod("split", [1, 2], created="2026-01-01T00:00:03Z", indices="2,3,4", uuids="x,y,z"),
    ]

    assert chosen(pods, 1).name == "one"
    assert chosen(pods, 2).name == "two"
    three = chosen(pods, 3)  # the containers' limits are summed
    assert (three.name, three.containers) == ("split", ("c0", "c1"))
    assert isinstance(choose_pod(pods, 4, NODE), NoMatch)


def test_pods_already_allocated_or_of_another_node_are_skipped() -> None:
    pods = [
        pod("done", created="2026-01-01T00:00:01Z", extra={"gpuloom.io/allocated": "c0"}),
        pod("elsewhere", created="2026-01-01T00:00:02Z", node="gpu-node-2"),
        pod("running", created="2026-01-01T00:00:03Z", phase="Running"),
        pod("not-gpuloom", created="2026-01-01T00:00:04Z", placed=False),
        pod("waiting", created="2026-01-01T00:00:09Z"),
    ]

    assert chosen(pods, 1).name == "waiting"


def test_a_pod_being_deleted_is_skipped() -> None:
    gone = pod("gone", created="2026-01-01T00:00:01Z")
    gone["metadata"]["deletionTimestamp"] = "2026-01-01T00:01:00Z"

    assert chosen([gone, pod("next", created="2026-01-01T00:00:02Z")], 1).name == "next"


def test_no_match_says_why() -> None:
    pods = [
        pod("done", extra={"gpuloom.io/allocated": "c0"}),
        pod("elsewhere", node="gpu-node-2"),
        pod("big", 4, indices="0,1,2,3", uuids="a,b,c,d"),
    ]

    found = choose_pod(pods, 1, NODE)

    assert isinstance(found, NoMatch)
    assert found.reason.startswith(
        f"no gpuloom-placed pod is waiting for 1 gpuloom.io/gpu on this node ({NODE})"
    )
    assert "team-a/done is already allocated" in found.reason
    assert "team-a/elsewhere is placed on 'gpu-node-2'" in found.reason
    assert "team-a/big wants 4" in found.reason


def test_no_pod_at_all() -> None:
    found = choose_pod([], 2, NODE)

    assert found == NoMatch(
        f"no gpuloom-placed pod is waiting for 2 gpuloom.io/gpu on this node ({NODE})"
    )


def test_a_share_gets_its_mps_limits() -> None:
    share = pod(
        "notebook",
        indices="2",
        uuids="GPU-c",
        extra={"gpuloom.io/gpu-milli": "250", "gpuloom.io/gpu-memory-mib": "20480"},
    )

    envs = chosen([share], 1).envs

    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-c"
    assert envs["GPULOOM_GPUS"] == "2"
    assert envs["GPULOOM_GPU_MILLI"] == "250"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "25"
    # keyed by the GPU's ordinal in the container, which sees only its own GPUs
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=20480M"
    assert envs["GPULOOM_GPU_MEMORY_MIB"] == "20480"


@pytest.mark.parametrize(
    ("milli", "percent"), [("125", "13"), ("1", "1"), ("5", "1"), ("999", "100")]
)
def test_a_share_percentage_is_rounded_up(milli: str, percent: str) -> None:
    envs = chosen([pod("s", extra={"gpuloom.io/gpu-milli": milli})], 1).envs

    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == percent
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" not in envs  # no memory annotated


def test_a_share_of_two_gpus_limits_each_one() -> None:
    share = pod(
        "pair",
        2,
        indices="1,3",
        uuids="GPU-b,GPU-d",
        extra={"gpuloom.io/gpu-milli": "500", "gpuloom.io/gpu-memory-mib": "1000,2000"},
    )

    envs = chosen([share], 2).envs

    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1000M,1=2000M"
    assert envs["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"


def test_whole_gpus_get_no_share_limits() -> None:
    envs = chosen([pod("whole", extra={"gpuloom.io/gpu-milli": "1000"})], 1).envs

    assert not [name for name in envs if name.startswith("CUDA_MPS_")]
    assert "GPULOOM_GPU_MILLI" not in envs


def test_a_slice_lent_by_another_node_is_listed_apart() -> None:
    lent = pod(
        "remote",
        2,
        indices="0,gpu-node-9/3",
        uuids="GPU-a,GPU-z",
        extra={"gpuloom.io/gpu-milli": "250", "gpuloom.io/gpu-memory-mib": "4096,8192"},
    )

    envs = chosen([lent], 2).envs

    assert envs["NVIDIA_VISIBLE_DEVICES"] == "GPU-a"
    assert envs["GPULOOM_GPUS"] == "0"
    assert envs["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4096M"
    assert envs["GPULOOM_REMOTE_GPUS"] == "gpu-node-9/GPU-z:250:8192"


def test_a_pod_with_unreadable_annotations_is_passed_over() -> None:
    pods = [
        pod("broken", created="2026-01-01T00:00:01Z", indices="0,1", uuids="GPU-a"),
        pod("fine", created="2026-01-01T00:00:02Z"),
    ]

    assert chosen(pods, 1).name == "fine"
    found = choose_pod(pods[:1], 1, NODE)
    assert isinstance(found, NoMatch)
    assert "team-a/broken: gpuloom.io/gpu-uuids lists 1 GPUs, gpuloom.io/gpus 2" in found.reason


@pytest.mark.parametrize(
    "annotations",
    [
        {"gpuloom.io/gpus": "", "gpuloom.io/gpu-uuids": ""},
        {"gpuloom.io/gpus": "zero", "gpuloom.io/gpu-uuids": "GPU-a"},
        {"gpuloom.io/gpus": "0", "gpuloom.io/gpu-uuids": "GPU-a", "gpuloom.io/gpu-milli": "0"},
        {"gpuloom.io/gpus": "0", "gpuloom.io/gpu-uuids": "a", "gpuloom.io/gpu-memory-mib": "1,2"},
    ],
)
def test_bad_placements_are_refused(annotations: dict[str, str]) -> None:
    with pytest.raises(BadPlacement):
        read_placement(annotations)


def test_read_placement() -> None:
    placement = read_placement(
        {
            "gpuloom.io/gpus": "0, 2",
            "gpuloom.io/gpu-uuids": "GPU-a,GPU-c",
            "gpuloom.io/job": "01J",
            "gpuloom.io/gpu-milli": "500",
            "gpuloom.io/gpu-memory-mib": "4096",
        }
    )

    assert placement.slices == (Slice(0, "GPU-a", None, 4096), Slice(2, "GPU-c", None, 4096))
    assert (placement.job_id, placement.milli) == ("01J", 500)

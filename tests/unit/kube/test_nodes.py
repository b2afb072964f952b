"""A Kubernetes Node as gpuloom reads it (`read_node`) and the name it has in gpuloom: a
label gpuloom cannot use is a `NodeProblem`, never an exception."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpuloom.events.inventory import TopologyPlace
from gpuloom.kube.nodes import (
    DEFAULT_GPU_MEMORY_MIB,
    UNKNOWN_MODEL,
    KubeNode,
    gpuloom_name,
    kube_name,
    read_node,
)
from gpuloom.kube.vocabulary import (
    GPU_RESOURCE,
    NODE_GPU_MEMORY,
    NODE_LENDS,
    NODE_MODEL,
    NODE_POOL,
    NODE_SPLIT,
    NODE_UUIDS,
    TOPOLOGY_PREFIX,
)

from .kubeworld import node_obj


def read(obj: dict[str, Any]) -> KubeNode:
    node = read_node(obj)
    assert node is not None
    return node


def usable(obj: dict[str, Any]) -> KubeNode:
    node = read(obj)
    assert node.spec is not None and node.problem is None, node.problem
    return node


def real_uuids(count: int) -> list[str]:
    """UUIDs as NVML gives them (`GPU-` and 36 characters)."""
    return [f"GPU-{uuid.UUID(int=0x8C3F0000 + i)}" for i in range(count)]


def test_a_node_that_offers_no_gpuloom_gpu_is_not_gpuloom_s() -> None:
    obj = node_obj("cpu-only")
    del obj["status"]["capacity"][GPU_RESOURCE]
    assert read_node(obj) is None
    assert read_node({}) is None


def test_a_plain_node_has_whole_gpus_of_an_unknown_model_on_kubernetes() -> None:
    node = usable(node_obj("node-a", 4))
    assert node.name == "node-a" and node.ready and not node.unschedulable
    assert node.spec is not None
    assert node.spec.runtimes == ["kubernetes"]
    assert [g.index for g in node.spec.gpus] == [0, 1, 2, 3]
    assert {(g.model, g.pool, g.memory_mib) for g in node.spec.gpus} == {
        (UNKNOWN_MODEL, "physical", DEFAULT_GPU_MEMORY_MIB)
    }
    assert [g.uuid for g in node.spec.gpus] == [f"node-a-gpu{i}" for i in range(4)]
    assert not node.spec.lends_remote_vgpu and node.spec.topology == []


@pytest.mark.parametrize(
    ("capacity", "split", "count"),
    [("8", "1", 8), ("40", "10", 4), ("45", "10", 4), ("9", "10", 0)],
)
def test_the_gpu_count_is_the_capacity_divided_by_the_split(
    capacity: str, split: str, count: int
) -> None:
    node = usable(node_obj("n", capacity=capacity, annotations={NODE_SPLIT: split}))
    assert node.spec is not None and len(node.spec.gpus) == count


def test_the_pool_model_and_memory_come_from_the_labels() -> None:
    labels = {NODE_POOL: "vgpu", NODE_MODEL: "A100-SXM4-80GB", NODE_GPU_MEMORY: "81920"}
    node = usable(node_obj("n", 2, labels=labels))
    assert node.spec is not None
    assert {(g.model, g.pool, g.memory_mib) for g in node.spec.gpus} == {
        ("A100-SXM4-80GB", "vgpu", 81920)
    }
    assert node.spec.labels == labels, "only gpuloom's labels are kept"


def test_a_label_wins_over_an_annotation_of_the_same_name() -> None:
    node = usable(node_obj("n", 1, labels={NODE_MODEL: "H100"}, annotations={NODE_MODEL: "A100"}))
    assert node.spec is not None and node.spec.gpus[0].model == "H100"


def test_the_topology_comes_from_the_topology_labels() -> None:
    labels = {TOPOLOGY_PREFIX + "rack": "r12", TOPOLOGY_PREFIX + "block": "b1"}
    node = usable(node_obj("n", 1, labels=labels))
    assert node.spec is not None
    assert node.spec.topology == [
        TopologyPlace(level="block", domain="b1"),
        TopologyPlace(level="rack", domain="r12"),
    ]


def test_the_uuids_annotation_names_the_gpus_when_its_count_matches() -> None:
    uuids = real_uuids(4)
    node = usable(node_obj("n", 4, annotations={NODE_UUIDS: ", ".join(uuids)}))
    assert node.spec is not None and [g.uuid for g in node.spec.gpus] == uuids


def test_uuids_of_another_count_give_way_to_stand_ins() -> None:
    node = usable(node_obj("n", 4, annotations={NODE_UUIDS: ",".join(real_uuids(3))}))
    assert node.spec is not None
    assert [g.uuid for g in node.spec.gpus] == [f"n-gpu{i}" for i in range(4)]


def test_the_uuids_of_a_split_node_are_one_per_gpu_not_per_device() -> None:
    uuids = real_uuids(2)
    obj = node_obj("n", capacity="20", annotations={NODE_SPLIT: "10", NODE_UUIDS: ",".join(uuids)})
    node = usable(obj)
    assert node.spec is not None and [g.uuid for g in node.spec.gpus] == uuids


def test_a_node_with_eight_real_gpu_uuids_is_usable() -> None:
    uuids = real_uuids(8)
    node = usable(node_obj("dgx-1", 8, annotations={NODE_SPLIT: "1", NODE_UUIDS: ",".join(uuids)}))
    assert node.spec is not None and [g.uuid for g in node.spec.gpus] == uuids


def test_a_capacity_in_canonical_kilo_form_is_read() -> None:
    node = usable(node_obj("n", capacity="2k", annotations={NODE_SPLIT: "100"}))
    assert node.spec is not None and len(node.spec.gpus) == 20


@pytest.mark.parametrize(("text", "lends"), [("true", True), ("false", False)])
def test_a_node_may_lend_remote_vgpu(text: str, lends: bool) -> None:
    node = usable(node_obj("n", 1, labels={NODE_LENDS: text}))
    assert node.spec is not None and node.spec.lends_remote_vgpu is lends


def test_ready_is_the_ready_condition() -> None:
    assert not read(node_obj("n", ready=False)).ready
    obj = node_obj("n")
    obj["status"]["conditions"] = [{"type": "Ready", "status": "Unknown"}]
    assert not read(obj).ready
    del obj["status"]["conditions"]
    assert not read(obj).ready
    assert read(node_obj("n")).ready


def test_unschedulable_is_the_node_s_spec() -> None:
    assert read(node_obj("n", unschedulable=True)).unschedulable
    assert not read(node_obj("n")).unschedulable


@pytest.mark.parametrize(
    ("labels", "annotations", "capacity", "said"),
    [
        ({NODE_POOL: "shared"}, {}, None, NODE_POOL),
        ({NODE_LENDS: "yes"}, {}, None, NODE_LENDS),
        ({NODE_GPU_MEMORY: "80Gi"}, {}, None, NODE_GPU_MEMORY),
        ({NODE_GPU_MEMORY: "0"}, {}, None, NODE_GPU_MEMORY),
        ({}, {NODE_SPLIT: "0"}, None, NODE_SPLIT),
        ({}, {NODE_SPLIT: "101"}, None, NODE_SPLIT),
        ({}, {NODE_SPLIT: "two"}, None, NODE_SPLIT),
        ({}, {}, "4.5", GPU_RESOURCE),
        ({}, {}, "-1", GPU_RESOURCE),
        ({}, {NODE_SPLIT: "1"}, "2000", "at most 1024"),
        ({NODE_MODEL: "A100 SXM"}, {}, None, ""),
        ({TOPOLOGY_PREFIX + "rack": "-r1"}, {}, None, ""),
    ],
)
def test_a_label_gpuloom_cannot_use_is_a_problem_not_an_exception(
    labels: dict[str, str], annotations: dict[str, str], capacity: str | None, said: str
) -> None:
    node = read(node_obj("bad-node", 4, labels=labels, annotations=annotations, capacity=capacity))
    assert node.spec is None and node.problem is not None
    assert node.problem.name == "bad-node" and said in node.problem.reason and node.problem.reason
    assert node.ready, "what the node says of itself is still read"


def test_a_name_with_dots_maps_to_underscores_and_back() -> None:
    node = usable(node_obj("gpu-7.rack-2.example.com"))
    assert node.name == "gpu-7_rack-2_example_com"
    assert gpuloom_name("gpu-7.rack-2.example.com") == node.name
    assert kube_name(node.name) == "gpu-7.rack-2.example.com"
    assert node.spec is not None and node.spec.gpus[0].uuid == "gpu-7_rack-2_example_com-gpu0"


def test_a_name_too_long_for_gpuloom_is_not_read() -> None:
    assert gpuloom_name("n" * 63) == "n" * 63
    assert gpuloom_name("n" * 64) is None
    assert read_node(node_obj("n" * 64)) is None
    assert read_node(node_obj("n" * 63)) is not None


def test_a_node_without_a_name_is_not_read() -> None:
    obj = node_obj("n")
    del obj["metadata"]["name"]
    assert read_node(obj) is None


LABEL_KEYS = st.one_of(
    st.sampled_from([NODE_POOL, NODE_MODEL, NODE_GPU_MEMORY, NODE_SPLIT, NODE_UUIDS, NODE_LENDS]),
    st.text(max_size=10).map(lambda s: TOPOLOGY_PREFIX + s),
    st.text(max_size=15),
)


@settings(max_examples=50, deadline=None)
@given(
    labels=st.dictionaries(LABEL_KEYS, st.text(max_size=80), max_size=6),
    annotations=st.dictionaries(LABEL_KEYS, st.text(max_size=80), max_size=4),
    capacity=st.one_of(st.text(max_size=6), st.integers(0, 10**6).map(str)),
)
def test_read_node_never_raises_whatever_the_labels(
    labels: dict[str, str], annotations: dict[str, str], capacity: str
) -> None:
    node = read_node(node_obj("node-a", labels=labels, annotations=annotations, capacity=capacity))
    assert node is not None and node.name == "node-a"
    assert (node.spec is None) == (node.problem is not None)
    if node.spec is not None:
        assert node.spec.runtimes == ["kubernetes"]
        assert len({g.index for g in node.spec.gpus}) == len(node.spec.gpus)

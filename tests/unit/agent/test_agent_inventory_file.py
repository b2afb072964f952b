"""The inventory file: simulated nodes declared in YAML."""

from __future__ import annotations

from pathlib import Path

import pytest

from services.agent.inventory_file import InventoryError, load_inventory, parse_inventory

GOOD = """
nodes:
  - name: node-a
    gpus: {model: A100-80GB, count: 4, memory_mib: 81920}
    cpu_milli: 64000
    memory_mib: 524288
    labels: {zone: a}
  - name: node-b
    gpus:
      - {index: 1, model: H100-80GB, memory_mib: 81920, uuid: GPU-1234}
      - {index: 0, model: H100-80GB, memory_mib: 81920}
  - name: cpu-only
"""


def test_a_good_file_gives_one_simulated_node_spec_per_entry() -> None:
    a, b, cpu = parse_inventory(GOOD)

    assert a.name == "node-a"
    assert [g.index for g in a.spec.gpus] == [0, 1, 2, 3]
    assert {g.model for g in a.spec.gpus} == {"A100-80GB"}
    assert a.spec.gpus[2].uuid == "GPU-sim-node-a-2"
    assert (a.spec.cpu_milli, a.spec.memory_mib, a.spec.labels) == (64000, 524288, {"zone": "a"})
    assert a.spec.simulated
    assert [(g.index, g.uuid) for g in b.spec.gpus] == [(0, "GPU-sim-node-b-0"), (1, "GPU-1234")]
    assert cpu.spec.gpus == [] and cpu.spec.simulated


def test_the_same_file_gives_the_same_specs() -> None:
    assert parse_inventory(GOOD) == parse_inventory(GOOD)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("nodes: []", "nodes: List should have at least 1 item"),
        ("- node-a", "must be a mapping with a 'nodes' list"),
        (
            "nodes:\n  - name: a\n    gpus: {model: A, count: 0, memory_mib: 1}",
            "nodes[0].gpus.count",
        ),
        (
            "nodes:\n  - name: a\n    gpus: {model: A, count: 2}",
            "nodes[0].gpus.memory_mib: Field required",
        ),
        ("nodes:\n  - name: a\n    gpus: 4", "nodes[0].gpus: must be a mapping"),
        ("nodes:\n  - name: a.b", "nodes[0].name"),
        ("nodes:\n  - {name: a}\n  - {name: b, colour: red}", "nodes[1].colour: Extra inputs"),
        (
            "nodes:\n  - name: a\n    gpus: [{index: 0, model: X, memory_mib: -1}]",
            "nodes[0].gpus[0].memory_mib",
        ),
        (
            "nodes:\n  - name: a\n    gpus:\n      - {index: 0, model: X, memory_mib: 1}\n"
            "      - {index: 0, model: X, memory_mib: 1}",
            "nodes[0].gpus[1].index: GPU index 0 is declared twice",
        ),
        ("nodes:\n  - {name: a}\n  - {name: a}", "nodes[1].name: node 'a' is declared twice"),
        (
            "nodes:\n  - name: a\n    gpus: [{index: 0, model: X, memory_mib: 1, uuid: G}]\n"
            "  - name: b\n    gpus: [{index: 0, model: X, memory_mib: 1, uuid: G}]",
            "uuid G is also a GPU of node a",
        ),
        ("nodes: [", "not valid YAML"),
    ],
    ids=[
        "no nodes",
        "not a mapping",
        "zero GPUs in a group",
        "group without memory",
        "gpus is a number",
        "node name with a dot",
        "unknown field",
        "negative memory",
        "GPU index twice",
        "node twice",
        "uuid twice",
        "broken YAML",
    ],
)
def test_a_bad_file_is_refused_with_the_bad_field_named(text: str, message: str) -> None:
    with pytest.raises(InventoryError) as caught:
        parse_inventory(text)
    assert message in str(caught.value)


def test_load_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "nodes.yaml"
    bad.write_text("nodes:\n  - name: a\n    gpus: {model: A, count: -1, memory_mib: 1}\n")

    with pytest.raises(InventoryError, match=r"nodes.yaml: nodes\[0\]\.gpus\.count"):
        load_inventory(bad)
    with pytest.raises(InventoryError, match="cannot read"):
        load_inventory(tmp_path / "missing.yaml")


def test_a_node_names_its_place_in_the_topology_tightest_level_first() -> None:
    [node] = parse_inventory(
        "nodes:\n  - name: n1\n    topology: {nvlink: nvl-1, rack: r1, block: b1}\n"
    )
    assert [(p.level, p.domain) for p in node.spec.topology] == [
        ("nvlink", "nvl-1"),
        ("rack", "r1"),
        ("block", "b1"),
    ]
    assert node.spec.domain("rack") == "r1" and node.spec.domain("zone") is None


def test_a_bad_topology_name_is_refused_naming_the_field() -> None:
    with pytest.raises(InventoryError, match=r"topology"):
        parse_inventory("nodes:\n  - name: n1\n    topology: {rack: 'r 1'}\n")


def test_the_dev_inventories_put_their_nodes_in_two_domains_of_each_level() -> None:
    """`make run`'s nodes, so that a newcomer sees the topology (docs/topology.md)."""
    root = Path(__file__).resolve().parents[3] / "deploy" / "inventory"
    nodes = [n for path in sorted(root.glob("*.yaml")) for n in load_inventory(path)]
    levels = {p.level for n in nodes for p in n.spec.topology}
    assert levels == {"nvlink", "rack", "block"}
    for level in levels:
        assert len({n.spec.domain(level) for n in nodes}) >= 2, level

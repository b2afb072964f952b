"""`gpuloom nodes` groups nodes by their place in the topology: sorted by domain from
the loosest level down, a section per domain of the loosest level."""

from __future__ import annotations

import io

from rich.console import Console

from gpuloom.client.nodes_table import nodes_table, topology_path
from gpuloom.client.schema import Node


def node(name: str, **topology: str) -> Node:
    return {
        "name": name,
        "state": "ready",
        "gpus": [{"index": 0, "model": "A100", "allocated": False}],  # type: ignore[typeddict-item]
        "cpu_milli": 0,
        "memory_mib": 0,
        "topology": topology,
    }


def shown(nodes: list[Node]) -> str:
    out = io.StringIO()
    Console(file=out, width=200, color_system=None).print(nodes_table(nodes))
    return out.getvalue()


def test_nodes_are_grouped_by_their_domains_loosest_level_first() -> None:
    nodes = [
        node("n4", nvlink="nvl-4", rack="r2", block="b1"),
        node("n1", nvlink="nvl-1", rack="r1", block="b2"),
        node("n2", nvlink="nvl-2", rack="r1", block="b1"),
        node("n3", nvlink="nvl-2", rack="r1", block="b1"),
    ]
    assert topology_path(nodes[0]) == ("b1", "r2", "nvl-4")
    text = shown(nodes)
    assert "TOPOLOGY (block/rack/nvlink)" in text
    order = [line.split()[0] for line in text.splitlines() if line.strip().startswith("b")]
    assert order == ["b1/r1/nvl-2", "b1/r1/nvl-2", "b1/r2/nvl-4", "b2/r1/nvl-1"]
    names = [n for n in ("n1", "n2", "n3", "n4") if n in text]
    assert sorted(names, key=text.index) == ["n2", "n3", "n4", "n1"]


def test_without_topology_nodes_are_sorted_by_name_and_no_column_is_shown() -> None:
    text = shown([node("n2"), node("n1")])
    assert "TOPOLOGY" not in text
    assert text.index("n1") < text.index("n2")

"""One milli-GPU constant: no module counts GPUs or CPUs in thousandths by a bare 1000
(`gpuloom.events.units`). The check reads the source: a 1000 beside a name that speaks
of milli-GPU or milli-CPU, in arithmetic or a comparison, is one spelt by hand."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
#: Names that speak of GPU or CPU thousandths.
WORDS = ("milli", "gpus", "piece", "share")
#: Thousands that are not the unit: FGD's sigmoid takes Δ in thousandths of the
#: cluster's capacity, a scale of its own.
NOT_THE_UNIT = {"libs/gpuloom/placement/policies/fragmentation_aware.py"}


def _names_in(node: ast.AST) -> str:
    return " ".join(
        n.id if isinstance(n, ast.Name) else n.attr
        for n in ast.walk(node)
        if isinstance(n, ast.Name | ast.Attribute)
    ).lower()


def _bare_thousands(tree: ast.AST) -> list[int]:
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp):
            sides = [node.left, node.right]
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
        else:
            continue
        thousand = any(isinstance(s, ast.Constant) and s.value == 1000 for s in sides)
        if thousand and any(word in _names_in(node) for word in WORDS):
            lines.append(node.lineno)
    return lines


def test_no_module_spells_the_milli_gpu_by_hand() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}"
        for folder in ("libs", "services")
        for path in (ROOT / folder).rglob("*.py")
        if str(path.relative_to(ROOT)) not in NOT_THE_UNIT
        for line in _bare_thousands(ast.parse(path.read_text()))
    ]
    assert found == []


def test_the_check_finds_one() -> None:
    assert _bare_thousands(ast.parse("x = run.gpus * 1000\ny = piece.milli < 1000")) == [1, 2]

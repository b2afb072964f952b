"""The gateway reads its SQL rows and its own fold of the log through one facade,
`services.gateway.reads`: no other module of the gateway reads the read model (its
fold, its explainer, its progress) or opens a session on the rows. The imports are
held by the `reads-behind-the-facade` contract (pyproject.toml); this test holds what
an import cannot show: an attribute read of a `Gateway`'s read model or sessions."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

GATEWAY = Path(__file__).parents[3] / "services" / "gateway"
#: The facade, and the fold and checkpoint follower it reads.
FACADE = {GATEWAY / "reads", GATEWAY / "readmodel.py"}
#: What only the facade reads: the read model (the fold, `explainer`), the sessions.
BEHIND_THE_FACADE = {"read_model", "explainer", "sessions"}
#: The composition root hands the sessions to the read model it makes (`attach_read_model`).
MAY_READ = {GATEWAY / "app.py": {"sessions"}}


def reads_behind_the_facade(source: str, allowed: frozenset[str] = frozenset()) -> list[str]:
    """`line: name` of each attribute read (not a write) of what only the facade reads."""
    return [
        f"{node.lineno}: .{node.attr}"
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Attribute)
        and isinstance(node.ctx, ast.Load)
        and node.attr in BEHIND_THE_FACADE - allowed
    ]


def outside_the_facade() -> list[Path]:
    return [
        path
        for path in sorted(GATEWAY.rglob("*.py"))
        if not any(path == part or part in path.parents for part in FACADE)
    ]


def test_no_module_outside_the_facade_reads_the_fold_or_the_rows() -> None:
    found = [
        f"{path.relative_to(GATEWAY)}:{where}"
        for path in outside_the_facade()
        for where in reads_behind_the_facade(path.read_text(), frozenset(MAY_READ.get(path, set())))
    ]
    assert not found, "read these through services.gateway.reads: " + ", ".join(found)


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("state = gateway.read_model.state", ["1: .read_model"]),
        ("shared = model.explainer(['j'])", ["1: .explainer"]),
        ("async with gateway.sessions() as session: pass", ["1: .sessions"]),
        ("gateway.read_model = read_model", []),
        ("reads.jobs.lookup(job_id)", []),
    ],
    ids=["the fold", "the explainer", "a session", "attaching it", "the facade"],
)
def test_the_scan_finds_a_read_and_lets_a_write_pass(source: str, found: list[str]) -> None:
    assert reads_behind_the_facade(source) == found


def test_the_scan_covers_the_route_modules_and_not_the_facade() -> None:
    scanned = {path.relative_to(GATEWAY).as_posix() for path in outside_the_facade()}
    assert {"jobs/routes.py", "webhooks/routes.py", "deps.py", "metrics.py"} <= scanned
    assert not any(path.startswith("reads/") or path == "readmodel.py" for path in scanned)

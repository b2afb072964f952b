"""The layers hold: each module imports only from the layers below its own, and the pure
core imports no I/O (the contracts in pyproject.toml, `[tool.importlinter]`)."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_import_contract_is_kept() -> None:
    linter = Path(sys.executable).parent / "lint-imports"
    result = subprocess.run(
        [str(linter), "--no-cache"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout


def test_every_route_module_of_the_gateway_is_held_apart() -> None:
    """The `routes-apart` contract lists its modules by name (import-linter takes no
    wildcard inside a name): a new route module must join it."""
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [apart] = [c for c in contracts["contracts"] if c["id"] == "routes-apart"]
    routes = {
        f"services.gateway.{path.stem}"
        for path in (ROOT / "services" / "gateway").glob("routes_*.py")
    }
    assert routes <= set(apart["modules"])

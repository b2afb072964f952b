"""The layers hold: each module imports only from the layers below its own, and the pure
core imports no I/O (the contracts in pyproject.toml, `[tool.importlinter]`)."""

from __future__ import annotations

import ast
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


GATEWAY = ROOT / "services" / "gateway"
#: Subpackages of the gateway that are no resource: the read facade all of them share.
SHARED_PACKAGES = {"reads"}


def gateway_contract(contract_id: str) -> set[str]:
    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    [contract] = [c for c in contracts["contracts"] if c["id"] == contract_id]
    return set(contract["modules"])


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def makes_routes(path: Path) -> bool:
    """Whether the module makes a router (`x = APIRouter(...)` at its top), or is a
    package's `routes` module."""
    if path.name == "routes.py":
        return True
    return any(
        isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", None) == "APIRouter"
        for node in ast.parse(path.read_text()).body
    )


def test_every_route_module_of_the_gateway_is_held_apart() -> None:
    """The `routes-apart` contract lists its modules by name (import-linter takes no
    wildcard inside a name): a new route module, wherever it is in the gateway, must
    join it."""
    routes = {module_name(path) for path in GATEWAY.rglob("*.py") if makes_routes(path)}
    assert "services.gateway.jobs.submit" in routes
    assert routes <= gateway_contract("routes-apart"), routes - gateway_contract("routes-apart")


def test_every_resource_package_of_the_gateway_is_held_apart() -> None:
    """Each subpackage of the gateway is one resource (jobs, cluster, ...) and joins the
    `resources-apart` contract; what they share lives in modules of its own."""
    packages = {
        module_name(init.parent)
        for init in GATEWAY.glob("*/__init__.py")
        if init.parent.name not in SHARED_PACKAGES
    }
    assert "services.gateway.jobs" in packages
    assert packages == gateway_contract("resources-apart")

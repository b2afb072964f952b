"""Fixtures of the CLI tests: a fake gateway and a runner wired to it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from fakegateway import FakeGateway, Invoke
from typer.testing import CliRunner, Result

from gpuloom.client.cli import app
from gpuloom.client.context import CliState


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No gateway settings nor tokens leak in from the developer's shell or home."""
    for name in ("GPULOOM_GATEWAY_URL", "GPULOOM_GATEWAY_PORT", "GPULOOM_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("USER", "alice")


@pytest.fixture
def fake() -> FakeGateway:
    return FakeGateway()


@pytest.fixture
def cli(fake: FakeGateway) -> Invoke:
    """Run `gpuloom ARGS` against `fake`; returns click's Result (stdout, stderr apart)."""
    runner = CliRunner()

    def invoke(args: Sequence[str]) -> Result:
        state = CliState(transport=fake.transport(), poll_interval_s=0)
        return runner.invoke(app, list(args), obj=state)

    return invoke

"""Fixtures of the CLI tests: a fake gateway and a runner wired to it."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from fakegateway import FakeGateway, Invoke
from typer.testing import CliRunner, Result

from gpuloom.client.cli import app
from gpuloom.client.context import CliState


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """No gateway settings leak in from the developer's shell."""
    for name in ("GPULOOM_GATEWAY_URL", "GPULOOM_GATEWAY_PORT"):
        monkeypatch.delenv(name, raising=False)
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

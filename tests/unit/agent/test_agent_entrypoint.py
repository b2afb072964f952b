"""The command line: which nodes to serve, and clear refusals."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from services.agent.__main__ import entrypoint


def test_a_bad_inventory_stops_the_agent_with_the_reason(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "nodes.yaml"
    bad.write_text("nodes:\n  - name: a\n    gpus: {model: A100, count: 0, memory_mib: 1}\n")

    with pytest.raises(SystemExit) as stopped:
        entrypoint(["--inventory", str(bad)])

    assert stopped.value.code == 2
    assert "nodes[0].gpus.count" in capsys.readouterr().err


def test_inventory_and_node_name_exclude_each_other(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        entrypoint(["--inventory", "x.yaml", "--node", "n1"])
    assert "not allowed with" in capsys.readouterr().err


def test_an_invalid_node_name_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        entrypoint(["--node", "bad.name"])

    assert stopped.value.code == 2
    assert "invalid node name" in capsys.readouterr().err


@pytest.mark.skipif(os.geteuid() != 0, reason="an agent that is not root runs jobs as itself")
@pytest.mark.parametrize("user", ["root", "no-such-user-gpuloom"])
def test_a_root_agent_with_an_unusable_job_user_does_not_start(
    user: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    inventory = tmp_path / "nodes.yaml"
    inventory.write_text("nodes:\n  - name: a\n    gpus: {model: A100, count: 1, memory_mib: 1}\n")
    monkeypatch.setenv("GPULOOM_AGENT_JOB_USER", user)

    with pytest.raises(SystemExit) as stopped:
        entrypoint(["--inventory", str(inventory)])

    assert stopped.value.code == 2
    assert "GPULOOM_AGENT_JOB_USER: " in capsys.readouterr().err

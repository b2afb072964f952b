"""`gpuloom submit --dependency`: sbatch's syntax, as far as gpuloom has its types."""

from __future__ import annotations

import pytest
import typer

from gpuloom.client.cli import parse_dependency


def test_sbatch_dependencies_become_depends_on() -> None:
    assert parse_dependency("afterok:a:b,afterany:c") == [
        {"job": "a", "when": "succeeded"},
        {"job": "b", "when": "succeeded"},
        {"job": "c", "when": "finished"},
    ]
    assert parse_dependency("j1") == [{"job": "j1", "when": "succeeded"}]


@pytest.mark.parametrize("text", ["afternotok:a", "singleton", "afterok:a::b", "afterok:"])
def test_what_gpuloom_does_not_have_is_refused(text: str) -> None:
    with pytest.raises(typer.BadParameter):
        parse_dependency(text)

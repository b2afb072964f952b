"""`gpuloom submit --signal` takes sbatch's form (issue #40): `USR1@60`, `SIGUSR2`, `10@30`."""

from __future__ import annotations

import pytest
import typer

from gpuloom.client.cli import parse_signal


@pytest.mark.parametrize(
    ("text", "wanted"),
    [
        ("USR1@60", {"name": "USR1", "before_s": 60}),
        ("SIGUSR2", {"name": "USR2", "before_s": 60}),
        ("usr1@5", {"name": "USR1", "before_s": 5}),
        ("10@30", {"name": "USR1", "before_s": 30}),
    ],
)
def test_sbatch_forms(text: str, wanted: dict[str, object]) -> None:
    assert parse_signal(text) == wanted


@pytest.mark.parametrize(
    ("text", "why"),
    [("B:USR1@60", "no B: flag"), ("USR1@soon", "not a number"), ("99@5", "no signal number 99")],
)
def test_what_it_refuses_says_why(text: str, why: str) -> None:
    with pytest.raises(typer.BadParameter, match=why):
        parse_signal(text)

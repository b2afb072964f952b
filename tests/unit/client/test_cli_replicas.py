"""`gpuloom submit --replicas` takes a gang's size, or an elastic gang's `MIN:MAX` as
torchrun's `--nnodes` (issue #40); the jobs table says how many an elastic gang has."""

from __future__ import annotations

from typing import Any

import pytest
import typer

from gpuloom.client.cli import parse_replicas
from gpuloom.client.render import gpus_text


@pytest.mark.parametrize(
    ("text", "wanted"), [("3", 3), ("2:8", {"min": 2, "max": 8}), ("4:2", {"min": 4, "max": 2})]
)
def test_a_size_or_a_range(text: str, wanted: object) -> None:
    assert parse_replicas(text) == wanted  # the gateway refuses 4:2, naming replicas.min


@pytest.mark.parametrize("text", ["", "two", "2:", ":4", "2:4:6", "-1"])
def test_anything_else_is_refused(text: str) -> None:
    with pytest.raises(typer.BadParameter, match="MIN:MAX"):
        parse_replicas(text)


def test_the_jobs_table_shows_an_elastic_gangs_size_among_its_range() -> None:
    states = ["running", "running", "left", "leaving", "running"]
    job: dict[str, Any] = {
        "gpus_requested": 4,
        "request": {"replicas": 8, "min_replicas": 2},
        "placement": [{"state": state} for state in states],
    }
    assert gpus_text(job) == "4 x 3 of 2-8 replicas"
    waiting = {**job, "placement": []}
    assert gpus_text(waiting) == "4 x 2-8 replicas"

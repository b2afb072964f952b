"""What the CLI's smaller tables say (issue #39, point 9): `explain`'s heading on a
line of its own, and `replay`'s priority of every job, placed ones too."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from gpuloom.client.logcmds import _queue_table
from gpuloom.client.render import explanation


def shown(renderable: Any, width: int = 100) -> str:
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(renderable)
    return out.getvalue()


def test_explain_heads_its_table_with_the_whole_title_on_one_line() -> None:
    job_id = "01JBXQ8Z7T3N4M5P6Q7R8S9T0V-17"
    answer: Any = {"id": job_id, "state": "queued", "reason": "Resources", "detail": "busy",
                   "position": 1, "ahead": [], "nodes": {"a": "full"}}  # fmt: skip
    lines = shown(explanation(answer)).splitlines()
    assert lines[0] == f"job {job_id}: queued"  # not wrapped to the narrow table's width
    assert any("Resources: busy" in line for line in lines[1:])


def test_replay_gives_the_priority_of_placed_and_running_jobs_too() -> None:
    running = [{"id": "r1", "state": "running", "node": "n1", "gpus": [0], "priority": 7}]
    queue = [{"id": "q1", "priority": 3, "gpus": 1, "user": "u"}]
    rows = [[cell.strip() for cell in line.split("│")[1:-1]] for line in shown(
        _queue_table(queue, running)
    ).splitlines() if line.startswith("│")]  # fmt: skip
    assert rows == [["r1", "running", "n1", "7"], ["q1", "queued", "-", "3"]]

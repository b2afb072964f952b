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


def test_show_of_an_array_lists_its_first_tasks_with_state_node_and_exit() -> None:
    from gpuloom.client.render import ARRAY_TASKS_SHOWN, array_tasks_table

    members = [
        {"id": f"a-{i}", "state": "succeeded" if i else "failed", "node": "n1", "exit_code": i % 2}
        for i in range(ARRAY_TASKS_SHOWN + 5)
    ]
    job: Any = {"array": {"tasks": [m["id"] for m in members], "states": {}, "members": members}}
    text = shown(array_tasks_table(job), width=120)
    assert "tasks: the first 20; 5 more in --json" in text.splitlines()[0]
    rows = [line.split() for line in text.splitlines() if line.strip().startswith("a-")]
    assert rows[0] == ["a-0", "failed", "n1", "0"] and len(rows) == ARRAY_TASKS_SHOWN
    assert array_tasks_table({"array": None}) is None  # type: ignore[typeddict-item]


def test_show_says_how_often_a_failed_gpu_requeued_the_job() -> None:
    from gpuloom.client.render import _requeues

    assert _requeues({"requeues": 0}) == ""  # type: ignore[typeddict-item]
    assert _requeues({"requeues": 2}) == " (requeued 2 times: a GPU failed under it)"  # type: ignore[typeddict-item]

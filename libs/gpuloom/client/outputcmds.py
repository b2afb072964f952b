"""`gpuloom logs`: a job's output, as the agents of the nodes it ran on keep it, of
any replica of a gang and any attempt. Registered on the top-level app by `cli`."""

from __future__ import annotations

from typing import Annotated

import typer

from gpuloom.client.api import GpuloomClient
from gpuloom.client.context import JsonFlag, gateway, print_json
from gpuloom.client.errors import ApiError
from gpuloom.client.schema import JobLogs

#: The commands of this module, merged into `gpuloom` (`cli.app`).
commands = typer.Typer()

JobId = Annotated[str, typer.Argument(help="Job id.", show_default=False)]
#: The tasks of an array whose logs `gpuloom logs <array id>` fetches, at most.
ARRAY_TASKS_SHOWN = 100


@commands.command()
def logs(
    ctx: typer.Context,
    job_id: JobId,
    stderr: Annotated[bool, typer.Option("--stderr", help="Show stderr, not stdout.")] = False,
    tail: Annotated[int | None, typer.Option(min=0, help="Only the last BYTES bytes.")] = None,
    replica: Annotated[int, typer.Option(min=0, help="A gang's replica.")] = 0,
    attempt: Annotated[
        int | None, typer.Option(min=1, help="An earlier attempt \\[default: the last].")
    ] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Every attempt of every replica, each under a header.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Print a job's output, as kept by the agent of the node it ran on; an array's id
    prints each task's, under a header."""
    with gateway(ctx) as client:
        tasks = array_tasks(client, job_id)
        if tasks is not None:
            found = task_logs(client, tasks, tail, replica, attempt)
        elif not every:
            answer = client.job_logs(job_id, tail_bytes=tail, replica=replica, attempt=attempt)
            if as_json:
                print_json(answer)
            else:
                typer.echo(answer["stderr"] if stderr else answer["stdout"], nl=False)
            return
        else:
            found = every_log(client, job_id, tail)
    if as_json:
        print_json(found)
        return
    for answer in found:
        task = f"task {answer['job_id']}, " if tasks is not None else ""
        typer.echo(
            f"==> {task}attempt {answer['attempt']}, replica {answer['replica']} "
            f"(node {answer['node']}) <=="
        )
        typer.echo(answer["stderr"] if stderr else answer["stdout"], nl=False)


def array_tasks(client: GpuloomClient, job_id: str) -> list[str] | None:
    """The tasks of `job_id` when it is an array's id (as `gpuloom show` reads it), else
    None. Only an id the gateway answers as an array costs the extra read: a task's id
    is `<array>-<index>` and a job's id is neither."""
    try:
        job = client.get_job(job_id)
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise
    summary = job.get("array")
    if not summary:
        return None
    tasks = list(summary["tasks"])
    if len(tasks) > ARRAY_TASKS_SHOWN:  # each task's logs is a request to its node's agent
        typer.echo(
            f"{job_id}: the first {ARRAY_TASKS_SHOWN} of {len(tasks)} tasks; "
            f"`gpuloom logs {job_id}-N` for any other",
            err=True,
        )
    return tasks[:ARRAY_TASKS_SHOWN]


def task_logs(
    client: GpuloomClient, tasks: list[str], tail: int | None, replica: int, attempt: int | None
) -> list[JobLogs]:
    """Each task's logs the nodes still hold (a task that never ran has none)."""
    found: list[JobLogs] = []
    for task in tasks:
        try:
            found.append(client.job_logs(task, tail, replica=replica, attempt=attempt))
        except ApiError as exc:
            if exc.status != 404:
                raise
    return found


def every_log(client: GpuloomClient, job_id: str, tail: int | None) -> list[JobLogs]:
    """The logs of every attempt of every replica the nodes still hold, in order."""
    job = client.get_job(job_id)
    # an elastic gang numbers the replicas that joined it after the others
    replicas = max(
        int((job.get("request") or {}).get("replicas") or 1), len(job.get("placement") or [])
    )
    found: list[JobLogs] = []
    for attempt in range(1, int(job["attempt"]) + 1):
        for replica in range(replicas):
            try:
                found.append(client.job_logs(job_id, tail, replica=replica, attempt=attempt))
            except ApiError as exc:
                if exc.status != 404:  # 404: never ran, or its node no longer keeps it
                    raise
    return found

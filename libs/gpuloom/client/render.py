"""Rich tables for the CLI: pure functions from gateway JSON to renderables.

Rows keep the gateway's order except where stated; nothing here does I/O.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table
from rich.text import Text

from gpuloom.client.schema import (
    Account,
    EventRecord,
    Job,
    JobExplanation,
    JobList,
    Queue,
    Usage,
    UsageRecord,
)
from gpuloom.decide.explain import reason_text

STATE_STYLES: dict[str, str] = {
    "succeeded": "green",
    "running": "cyan",
    "placed": "cyan",
    "failed": "red",
    "rejected": "red",
    "timed_out": "red",
    "cancelled": "yellow",
}


def new_table(title: str | None = None, caption: str | None = None) -> Table:
    """The house style: a header line, no borders (kubectl-like, compact)."""
    return Table(
        title=title,
        caption=caption,
        title_justify="left",
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        header_style="bold",
    )


def state_text(state: str) -> str:
    style = STATE_STYLES.get(state)
    return f"[{style}]{state}[/{style}]" if style else state


def when(value: str | None) -> str:
    """An ISO 8601 timestamp as `YYYY-MM-DD HH:MM:SS` (its own zone kept implicit)."""
    if not value:
        return "-"
    return value.replace("T", " ")[:19]


def dash(value: object) -> str:
    return "-" if value is None or value == "" else str(value)


#: The states of a replica that holds its GPUs (`placement[].state`).
LIVE_REPLICA = frozenset({"placed", "running"})


def gpus_text(job: Job) -> str:
    """Requested count, plus the assigned indexes once placed: `2 [0,3]`; a gang's, per
    replica (its replicas' GPUs are in the replicas table, `gpuloom show`)."""
    request = job.get("request") or {}
    replicas = int(request.get("replicas") or 1)
    least = request.get("min_replicas")
    if least is not None:  # an elastic gang: how many it has now, of its range
        live = sum(1 for r in job.get("placement") or [] if r.get("state") in LIVE_REPLICA)
        now = f"{live} of " if job.get("placement") else ""
        return f"{job['gpus_requested']} x {now}{least}-{replicas} replicas"
    if replicas > 1:
        return f"{job['gpus_requested']} x {replicas} replicas"
    text = str(job["gpus_requested"])
    if job.get("gpus"):
        text += " [" + ",".join(str(i) for i in job["gpus"]) + "]"
    return text


def jobs_table(answer: JobList, *, order: str = "newest", offset: int = 0) -> Table:
    shown, total = len(answer["jobs"]), answer["total"]
    caption = f"{shown} of {total} jobs, {order} first"
    if offset + shown < total:
        caption += f" (--offset {offset + shown} for the next, --all for every one)"
    table = new_table(caption=caption)
    table.add_column("ID", no_wrap=True)
    table.add_column("NAME")
    table.add_column("USER")
    table.add_column("ACCOUNT")
    table.add_column("STATE", no_wrap=True)
    table.add_column("GPUS", justify="right")
    table.add_column("NODE")
    table.add_column("PRIO", justify="right")
    table.add_column("SUBMITTED", no_wrap=True)
    table.add_column("REASON")
    for job in answer["jobs"]:
        table.add_row(
            job["id"],
            job["name"],
            job["user"],
            job["account"],
            state_text(job["state"]),
            gpus_text(job),
            dash(job.get("node")),
            str(job["priority"]),
            when(job.get("submitted_at")),
            dash(job.get("reason")),
        )
    return table


def _placement_asks(request: dict[str, object]) -> list[tuple[str, str]]:
    """The topology and the reservation a job asked for, where it asked."""
    rows = []
    topology = request.get("topology")
    if isinstance(topology, dict):
        rows.append(("topology", f"{topology.get('mode')} {topology.get('level')}"))
    if request.get("reservation"):
        rows.append(("reservation", str(request["reservation"])))
    return rows


def _requeues(job: Job) -> str:
    """`(requeued 2 times: a GPU failed under it)`, or nothing."""
    count = job.get("requeues") or 0
    return (
        f" (requeued {count} time{'s' if count > 1 else ''}: a GPU failed under it)"
        if count
        else ""
    )


def job_details(job: Job) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    rows: list[tuple[str, str]] = [
        ("id", job["id"]),
        ("name", job["name"]),
        ("user", f"{job['user']} (account {job['account']})"),
        ("state", state_text(job["state"])),
        ("reason", dash(job.get("reason"))),
        ("command", _command_text(job.get("command"))),
        ("image", (job.get("request") or {}).get("image") or "none (a process on the node)"),
        *_placement_asks(job.get("request") or {}),
        ("gpus", gpus_text(job)),
        ("gpu model", ", ".join(job.get("gpu_model") or []) or "any"),
        ("priority", str(job["priority"])),
        ("node", dash(job.get("node"))),
        ("attempt", str(job["attempt"]) + _requeues(job)),
        ("cancel requested", "yes" if job.get("cancel_requested") else "no"),
        ("exit code", dash(job.get("exit_code"))),
        ("submitted", when(job.get("submitted_at"))),
        ("started", when(job.get("started_at"))),
        ("finished", when(job.get("finished_at"))),
    ]
    array = job.get("array")
    if array:
        counts = ", ".join(f"{count} {state}" for state, count in array["states"].items())
        rows.insert(4, ("array", f"{len(array['tasks'])} tasks: {counts}"))
    for key, value in rows:
        table.add_row(key, value)
    return table


#: The tasks of an array `gpuloom show` lists (`--json` has every one the gateway gives).
ARRAY_TASKS_SHOWN = 20


def array_tasks_table(job: Job) -> Group | None:
    """The first tasks of an array, each with its state, node and exit code, as squeue
    lists an array's tasks (None: not an array's id)."""
    array = job.get("array")
    if not array or "members" not in array:
        return None
    members = array["members"]
    shown = members[:ARRAY_TASKS_SHOWN]
    more = len(array["tasks"]) - len(shown)
    # the heading on a line of its own: a table's title wraps to the table's width
    heading = "tasks" if not more else f"tasks: the first {len(shown)}; {more} more in --json"
    table = new_table()
    for column in ("TASK", "STATE", "NODE", "EXIT"):
        table.add_column(column, no_wrap=True)
    for task in shown:
        table.add_row(
            task["id"], state_text(task["state"]), dash(task.get("node")), dash(task["exit_code"])
        )
    return Group(heading, table)


def replicas_table(job: Job) -> Table | None:
    """Each replica of a gang: its node, GPUs, state and exit code (None: one replica)."""
    placement = job.get("placement") or []
    if len(placement) < 2:
        return None
    table = new_table(title="replicas")
    for column in ("REPLICA", "NODE", "GPUS", "STATE", "EXIT", "REASON"):
        table.add_column(column, no_wrap=column != "REASON")
    for position, replica in enumerate(placement):
        gpus = ",".join(
            f"{piece['node']}:{piece['index']}" if piece["node"] != replica["host"]
            else str(piece["index"])
            for piece in replica.get("slices", [])
        )  # fmt: skip
        number = replica.get("replica")
        state = replica.get("state")
        table.add_row(
            str(position if number is None else number),
            replica["host"],
            gpus or "-",
            "-" if state is None else state_text(state),
            dash(replica.get("exit_code")),
            dash(replica.get("reason")),
        )
    return table


def _data_text(data: dict[str, Any], limit: int = 100) -> str:
    text = json.dumps(data, separators=(",", ":"), sort_keys=True)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def events_table(events: Iterable[EventRecord]) -> Table:
    table = new_table(title="events")
    table.add_column("SEQ", justify="right")
    table.add_column("AT", no_wrap=True)
    table.add_column("TYPE", no_wrap=True)
    table.add_column("BY")
    table.add_column("DATA", overflow="fold")
    for event in events:
        table.add_row(
            str(event["seq"]),
            when(event["at"]),
            event["type"],
            _by_text(event),
            _data_text(event["data"]),
        )
    return table


def _command_text(command: list[str] | None) -> str:
    return "(hidden: another user's job)" if command is None else " ".join(command)


def _by_text(event: EventRecord) -> str:
    """The writer, and who asked when a request caused it: `gateway (ops)`."""
    principal = event.get("principal")
    return f"{event['by']} ({principal})" if principal else event["by"]


def _hours(gpu_seconds: float) -> str:
    return f"{gpu_seconds / 3600:.2f}"


def usage_tables(usage: Usage) -> tuple[Table, ...]:
    """Per account, per user and per GPU model, most GPU time first, then by name; and,
    when runs are going on, what they used since their last charge."""
    tables = [
        _usage_table("usage per account", ("account",), usage["accounts"]),
        _usage_table("usage per user", ("user", "account"), usage["users"]),
        _usage_table("usage per GPU model", ("gpu_model",), usage.get("gpu_models", [])),
    ]
    running = usage.get("running") or []
    if running:
        title = "running now, not yet charged (since each run's last charge)"
        tables.append(_usage_table(title, ("user", "account"), running))
    return tuple(tables)


def _usage_table(title: str, keys: tuple[str, ...], rows: Sequence[Mapping[str, Any]]) -> Table:
    """One table of GPU time: a column per key, then jobs, GPU-hours and GPU-seconds."""
    table = new_table(title=title)
    for key in keys:
        table.add_column("GPU MODEL" if key == "gpu_model" else key.upper())
    for column in ("JOBS", "GPU-HOURS", "GPU-SECONDS"):
        table.add_column(column, justify="right")
    for row in sorted(rows, key=lambda r: (-r["gpu_seconds"], *(r[k] for k in keys))):
        seconds = row["gpu_seconds"]
        table.add_row(*(row[k] for k in keys), str(row["jobs"]), _hours(seconds), f"{seconds:.1f}")
    return table


def usage_records_table(records: list[UsageRecord]) -> Table:
    """One row per charged run, oldest first (like sacct)."""
    table = new_table(title=f"{len(records)} charged runs")
    for column in [
        "JOB",
        "ATTEMPT",
        "USER",
        "ACCOUNT",
        "GPUS",
        "SECONDS",
        "GPU-SECONDS",
        "CHARGED",
    ]:
        table.add_column(column)
    for r in records:
        table.add_row(
            r["job_id"],
            str(r["attempt"]),
            r["user"],
            r["account"],
            str(r["gpus"]),
            f"{r['seconds']:.1f}",
            f"{r['gpu_seconds']:.1f}",
            str(r["charged_at"])[:19].replace("T", " "),
        )
    return table


def explanation(answer: JobExplanation) -> Group:
    """`gpuloom explain`: the verdict first, then each node's, under a heading of its
    own (a table's title wraps to the table's width, which short verdicts keep narrow)."""
    table = new_table()
    table.add_column("WHAT")
    table.add_column("WHY")
    table.add_row("reason", reason_text(answer.get("reason"), answer.get("detail")) or "-")
    if answer.get("position") is not None:
        ahead = ", ".join(answer.get("ahead", [])) or "-"
        table.add_row("position", f"{answer['position']} (ahead: {ahead})")
    if answer.get("estimated_start"):
        table.add_row("estimated start", str(answer["estimated_start"])[:19].replace("T", " "))
    for node, verdict in sorted(answer.get("nodes", {}).items()):
        table.add_row(f"node {node}", verdict)
    heading = Text(f"job {answer['id']}: {answer['state']}", style="bold")
    return Group(heading, table)


def queue_table(answer: Queue) -> Table:
    """`gpuloom queue`: position, job, priority, each factor and the total points."""
    weights = answer.get("weights", {})
    title = (
        f"queue (weights: age {weights.get('age', 0):g}, fair share "
        f"{weights.get('fair_share', 0):g}, size {weights.get('size', 0):g})"
    )
    table = new_table(title=title)
    for column in [
        "#",
        "JOB",
        "USER",
        "ACCOUNT",
        "PRIO",
        "AGE",
        "FAIRSHARE",
        "SIZE",
        "POINTS",
        "WAITS ON",
    ]:
        table.add_column(column)
    for job in answer.get("jobs", []):
        table.add_row(
            str(job["position"]),
            job["id"],
            job["user"],
            job["account"],
            str(job["priority"]),
            f"{job['age']:.3f}",
            f"{job['fair_share']:.3f}",
            f"{job['size']:.3f}",
            f"{job['points']:.2f}",
            job.get("reason") or "-",
        )
    return table


def accounts_table(accounts: list[Account]) -> Table:
    table = new_table(title="accounts")
    for column in ["ACCOUNT", "PARENT", "SHARES", "QUOTAS", "DESCRIPTION"]:
        table.add_column(column)
    for account in accounts:
        quotas = [
            f"{q['resource']}={q['nominal']}"
            + (f"+{q['borrowing_limit']}" if q.get("borrowing_limit") is not None else "")
            + (f" cap {q['cap']}" if q.get("cap") is not None else "")
            for q in account.get("quotas") or []
        ]
        table.add_row(
            account["name"],
            account.get("parent") or "-",
            str(account["shares"]),
            ", ".join(quotas) or "-",
            account["description"],
        )
    return table

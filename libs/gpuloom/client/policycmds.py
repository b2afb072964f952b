"""`gpuloom priority-class ...` and `gpuloom limits ...`: the operators' policies.

Anyone may list them; setting and deleting needs an operator's token (the gateway
answers 403 otherwise):

    gpuloom priority-class set urgent --priority 1000 --accounts research
    gpuloom priority-class set batch --priority 10 --no-preempt --default
    gpuloom priority-class delete urgent
    gpuloom limits set user alice --max-submit-jobs 100 --max-gpus 8
    gpuloom limits set account research --max-array-size 1000
    gpuloom limits set default user --max-submit-jobs 500   # every user without their own
    gpuloom limits set cluster all --max-submit-jobs 50000
"""

from __future__ import annotations

from typing import Annotated, Any

import typer
from rich.table import Table

from gpuloom.client.context import JsonFlag, emit, fail, gateway, print_json
from gpuloom.client.schema import LimitsList, PriorityClassList

priority_class_app = typer.Typer(
    help="Priority classes: the priorities jobs may ask and who may preempt.",
    no_args_is_help=True,
)
limits_app = typer.Typer(
    help="Limits per user and account: jobs submitted, array size, GPUs held.",
    no_args_is_help=True,
)


def _names(value: str | None) -> list[str]:
    return [name for name in (value or "").split(",") if name]


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)


def _classes_table(answer: PriorityClassList) -> Table:
    table = Table("CLASS", "PRIORITY", "PREEMPTS", "USERS", "ACCOUNTS", "DEFAULT", "DESCRIPTION")
    for known in answer["classes"]:
        everyone = not known["users"] and not known["accounts"]
        table.add_row(
            known["name"],
            str(known["priority"]),
            "yes" if known["may_preempt"] else "no",
            "everyone" if everyone else ",".join(known["users"]) or "-",
            "everyone" if everyone else ",".join(known["accounts"]) or "-",
            "yes" if known["name"] == answer["default"] else "",
            known["description"],
        )
    return table


def _limits_table(answer: LimitsList) -> Table:
    table = Table("SCOPE", "NAME", "MAX SUBMIT JOBS", "MAX ARRAY SIZE", "MAX GPUS")
    for row in answer["limits"]:
        table.add_row(
            row["scope"],
            row["name"],
            _dash(row["max_submit_jobs"]),
            _dash(row["max_array_size"]),
            _dash(row["max_gpus"]),
        )
    for scope, limits in sorted(answer.get("defaults", {}).items()):
        table.add_row(
            "in force",
            "every " + scope if scope != "cluster" else "the cluster",
            _dash(limits["max_submit_jobs"]),
            _dash(limits["max_array_size"]),
            _dash(limits["max_gpus"]),
        )
    return table


def _show(answer: object, as_json: bool, table: Table) -> None:
    if as_json:
        print_json(answer)
    else:
        emit(table)


@priority_class_app.command("list")
def list_classes(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Every priority class a job may name (--priority-class), and the default one."""
    with gateway(ctx) as client:
        answer = client.priority_classes()
    _show(answer, as_json, _classes_table(answer))


@priority_class_app.command("set")
def set_class(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Class name.", show_default=False)],
    priority: Annotated[
        int,
        typer.Option(help="Its priority, and the most a job in it may ask.", show_default=False),
    ],
    preempt: Annotated[
        bool, typer.Option("--preempt/--no-preempt", help="Whether its jobs may preempt.")
    ] = True,
    users: Annotated[
        str | None, typer.Option(help="Users who may use it, comma-separated.")
    ] = None,
    accounts: Annotated[
        str | None,
        typer.Option(help="Accounts whose jobs may use it, comma-separated (none: everyone)."),
    ] = None,
    description: Annotated[str, typer.Option(help="What it is for.")] = "",
    default: Annotated[
        bool, typer.Option("--default", help="The class of submissions that name none.")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Define or redefine a priority class (operators)."""
    body = {
        "priority": priority,
        "may_preempt": preempt,
        "users": _names(users),
        "accounts": _names(accounts),
        "description": description,
        "default": default,
    }
    with gateway(ctx) as client:
        answer = client.set_priority_class(name, body)
    _show(answer, as_json, _classes_table(answer))


@priority_class_app.command("delete")
def delete_class(
    ctx: typer.Context,
    name: Annotated[str, typer.Argument(help="Class name.", show_default=False)],
    as_json: JsonFlag = False,
) -> None:
    """Remove a priority class (operators); its jobs keep their priority."""
    with gateway(ctx) as client:
        answer = client.delete_priority_class(name)
    _show(answer, as_json, _classes_table(answer))


@limits_app.command("list")
def list_limits(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """The limits operators set, then those in force where they set none."""
    with gateway(ctx) as client:
        answer = client.limits()
    _show(answer, as_json, _limits_table(answer))


@limits_app.command("set")
def set_limits(
    ctx: typer.Context,
    scope: Annotated[
        str, typer.Argument(help="user, account, default or cluster.", show_default=False)
    ],
    name: Annotated[
        str,
        typer.Argument(
            help="The user's or account's name; for default: user or account; for cluster: all.",
            show_default=False,
        ),
    ],
    max_submit_jobs: Annotated[
        int | None, typer.Option(min=0, help="Jobs submitted and not ended (pending, running).")
    ] = None,
    max_array_size: Annotated[int | None, typer.Option(min=1, help="Tasks in one array.")] = None,
    max_gpus: Annotated[
        int | None, typer.Option(min=0, help="GPUs held by its running jobs (fractions count).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Set every limit of one user or account, the defaults or the cluster's total
    (operators); a limit not given falls back to the default's, then the built-in one,
    and none given removes the entry."""
    if scope not in ("user", "account", "default", "cluster"):
        fail(f"scope must be user, account, default or cluster, not {scope!r}", 2)
    body = {
        "max_submit_jobs": max_submit_jobs,
        "max_array_size": max_array_size,
        "max_gpus": max_gpus,
    }
    with gateway(ctx) as client:
        answer = client.set_limits(scope, name, body)
    _show(answer, as_json, _limits_table(answer))

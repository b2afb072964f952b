"""`gpuloom` commands about the cluster rather than one job: accounts, nodes and their
cordons, usage, health, dead letters. Registered on the top-level app by `cli`."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from gpuloom.client import render
from gpuloom.client.context import JsonFlag, emit, fail, gateway, print_json
from gpuloom.client.nodes_table import nodes_table

#: The commands of this module, merged into `gpuloom` (`cli.app`).
commands = typer.Typer()


@commands.command()
def accounts(
    ctx: typer.Context,
    create: Annotated[str | None, typer.Option(help="Create this account.")] = None,
    parent: Annotated[str | None, typer.Option(help="With --create: its parent.")] = None,
    shares: Annotated[
        int | None, typer.Option(min=0, help="With --create, or with --account: its shares.")
    ] = None,
    account: Annotated[
        str | None, typer.Option(help="Set --shares or --quota of this account.")
    ] = None,
    quota: Annotated[
        int | None,
        typer.Option(help="With --account: nominal quota of --resource (-1 removes it)."),
    ] = None,
    resource: Annotated[
        str,
        typer.Option(help="gpu_milli (1000 per GPU), gpus, model:<name> or pool:vgpu|physical."),
    ] = "gpu_milli",
    borrowing_limit: Annotated[
        int | None, typer.Option(min=0, help="With --quota: most it may borrow.")
    ] = None,
    cap: Annotated[int | None, typer.Option(min=0, help="With --quota: hard ceiling.")] = None,
    users: Annotated[
        str | None,
        typer.Option(help="With --account: who may submit, comma-separated ('' lets anyone)."),
    ] = None,
    coordinators: Annotated[
        str | None,
        typer.Option(
            help="With --account: who coordinates it and its sub-accounts, comma-separated "
            "('' names none; operators only)."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """List accounts, create one (--create NAME [--parent P] [--shares N]), set shares
    (--account A --shares N), members (--account A --users u1,u2), coordinators
    (--account A --coordinators u1,u2) or a quota
    (--account A --quota N [--resource R] [--borrowing-limit L] [--cap C])."""
    with gateway(ctx) as client:
        if create is not None:
            client.create_account(create, parent, 1 if shares is None else shares)
        elif account is not None:
            if shares is None and quota is None and users is None and coordinators is None:
                fail("--account needs --shares, --quota, --users or --coordinators", 2)
            if users is not None:
                client.set_users(account, [u for u in users.split(",") if u])
            if coordinators is not None:
                client.set_coordinators(account, [u for u in coordinators.split(",") if u])
            if shares is not None:
                client.set_shares(account, shares)
            if quota is not None:
                nominal = None if quota < 0 else quota
                client.set_quota(account, resource, nominal, borrowing_limit, cap)
        answer = client.accounts()
    if as_json:
        print_json(answer)
        return
    emit(render.accounts_table(answer["accounts"]))


nodes_app = typer.Typer(invoke_without_command=True, no_args_is_help=False)
commands.add_typer(nodes_app, name="nodes")


@nodes_app.callback()
def nodes(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """List nodes and their GPUs (`nodes remove NODE`: one gone for good)."""
    if ctx.invoked_subcommand is not None:
        return
    with gateway(ctx) as client:
        answer = client.nodes()
    if as_json:
        print_json(answer)
    else:
        emit(nodes_table(answer["nodes"]))


@nodes_app.command("remove")
def remove_node(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="The node gone for good.")],
    reason: Annotated[str, typer.Option(help="Why (kept in the log).")] = "",
) -> None:
    """Remove a node gone for good (operators; the log records who): it must hold no job."""
    with gateway(ctx) as client:
        answer = client.remove_node(node, reason)
    typer.echo(f"{node} removed (seq {answer['seq']})")


gpus_app = typer.Typer(no_args_is_help=True, help="GPUs out of service: resume one.")
commands.add_typer(gpus_app, name="gpus")


@gpus_app.command("resume")
def resume_gpu(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="The GPU's node.")],
    index: Annotated[int, typer.Argument(min=0, max=1023, help="The GPU's index on it.")],
    reason: Annotated[str, typer.Option(help="Why it is sound again (kept in the log).")] = "",
) -> None:
    """Return a GPU that failed a health check to service (operators; the log records who)."""
    with gateway(ctx) as client:
        answer = client.resume_gpu(node, index, reason)
    typer.echo(f"GPU {node}/{index} back in service (seq {answer['seq']})")


@commands.command()
def cordon(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="The node to take out of placement.")],
    reason: Annotated[str, typer.Option(help="Why (shown by nodes and explain).")] = "",
) -> None:
    """Take a node out of placement: nothing new lands on it, what runs there stays."""
    with gateway(ctx) as client:
        client.cordon(node, reason)
    typer.echo(f"{node} cordoned")


@commands.command()
def uncordon(
    ctx: typer.Context,
    node: Annotated[str, typer.Argument(help="The node to give back to placement.")],
) -> None:
    """Give a cordoned node back to placement."""
    with gateway(ctx) as client:
        client.uncordon(node)
    typer.echo(f"{node} uncordoned")


@commands.command()
def usage(
    ctx: typer.Context,
    since: Annotated[str | None, typer.Option(help="Charges at or after (ISO time).")] = None,
    until: Annotated[str | None, typer.Option(help="Charges before (ISO time).")] = None,
    jobs: Annotated[bool, typer.Option("--jobs", help="One record per charged run.")] = False,
    account: Annotated[str | None, typer.Option(help="With --jobs: only this account.")] = None,
    user: Annotated[str | None, typer.Option(help="With --jobs: only this user.")] = None,
    group_by: Annotated[
        str, typer.Option(help="With --csv: account, user or gpu_model.")
    ] = "account",
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV on stdout.")] = False,
    as_json: JsonFlag = False,
) -> None:
    """GPU time used (a 0.25 GPU for an hour is 0.25 GPU-hours), per account, user, model."""
    with gateway(ctx) as client:
        if as_csv:
            typer.echo(
                client.usage_csv("jobs" if jobs else "usage", group_by, since, until), nl=False
            )
            return
        if jobs:
            records = client.usage_records(since, until, account=account or "", user=user or "")
            if as_json:
                print_json(records)
            else:
                emit(render.usage_records_table(records["records"]))
            return
        answer = client.usage(since, until)
    if as_json:
        print_json(answer)
        return
    emit(*render.usage_tables(answer))


@commands.command()
def health(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """The gateway's health; exits 1 unless it is ok and connected to NATS."""
    with gateway(ctx) as client:
        answer = client.health()
    healthy = answer.get("status") == "ok" and bool(answer.get("nats"))
    if as_json:
        print_json(answer)
    else:
        nats = "connected" if answer.get("nats") else "[red]disconnected[/red]"
        emit(
            f"{answer.get('status')}: NATS {nats}, projection at seq {answer.get('projection_seq')}"
        )
    if not healthy:
        raise typer.Exit(1)


@commands.command()
def deadletters(
    ctx: typer.Context,
    limit: Annotated[int, typer.Option(min=1, max=1000, help="At most this many.")] = 50,
    as_json: JsonFlag = False,
) -> None:
    """Messages the services could not handle and skipped (the dead-letter stream)."""
    with gateway(ctx) as client:
        answer = client.dead_letters(limit)
    if as_json:
        print_json(answer)
        return
    table = Table(title=f"{answer['total']} dead letters in {answer['stream']}, newest first")
    for column in ["at", "service", "seq / subject", "kind", "reason"]:
        table.add_column(column)
    for letter in answer["dead_letters"]:
        where = letter.get("seq") or letter.get("subject") or "-"
        table.add_row(
            *(escape(str(letter.get(k) or "-")) for k in ("at", "service")),
            escape(str(where)),
            escape(str(letter.get("reason_kind") or "-")),
            escape(str(letter.get("reason") or "-")),
        )
    emit(table)

"""`gpuloom reservation ...`: advance reservations, GPUs held for a window of time for
some users or accounts, or for maintenance (docs/reservations.md).

Anyone may list and show them; making, changing and deleting needs an operator's
token (the gateway answers 403 otherwise):

    gpuloom reservation create train --start 2027-01-04T09:00+01:00 --duration 8h \\
        --gpus 8 --gpu-model H100-80GB --topology rack --accounts research
    gpuloom reservation create fix --start now+1h --duration 2h --nodes node-a --maint
    gpuloom reservation update train --duration 12h --users alice
    gpuloom reservation delete train        # its waiting jobs are cancelled
    gpuloom submit --reservation train --account research --gpus 8 -- python train.py
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gpuloom.client.context import JsonFlag, emit, gateway, print_json
from gpuloom.client.render import when
from gpuloom.client.schema import Reservation, ReservationList

reservation_app = typer.Typer(
    help="Advance reservations: GPUs held for a window for some users or accounts, or "
    "for maintenance.",
    no_args_is_help=True,
)

Name = Annotated[str, typer.Argument(help="Reservation name.", show_default=False)]
DURATION = re.compile(r"(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
UNIT_S = (86_400, 3_600, 60, 1)


def parse_duration(text: str) -> int:
    """`90` (seconds), `45m`, `2h`, `1d12h`, `1h30m`: whole seconds, more than 0."""
    found = DURATION.fullmatch(text.strip())
    if text.strip().isdigit():
        seconds = int(text)
    elif found is not None and any(found.groups()):
        seconds = sum(int(n) * unit for n, unit in zip(found.groups(), UNIT_S, strict=True) if n)
    else:
        raise typer.BadParameter(f"{text!r}: give seconds, or e.g. 45m, 2h, 1d12h")
    if seconds <= 0:
        raise typer.BadParameter(f"{text!r}: a duration is more than 0 s")
    return seconds


def parse_time(text: str, now: datetime | None = None) -> str:
    """`now`, `now+DURATION` or an ISO 8601 time (one without an offset is local time),
    as the gateway takes it: `now` or an ISO 8601 time with its offset."""
    text = text.strip()
    if text == "now":
        return text
    if text.startswith("now+"):
        moment = (now or datetime.now(UTC)) + timedelta(seconds=parse_duration(text[4:]))
        return moment.isoformat()
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r}: give now, now+2h or an ISO 8601 time") from None
    return (moment if moment.tzinfo is not None else moment.astimezone()).isoformat()


def _names(value: str | None) -> list[str] | None:
    return None if value is None else [name for name in value.split(",") if name]


def _table(reservations: list[Reservation]) -> Table:
    table = Table("NAME", "STATE", "START", "END", "GPUS", "NODES", "USERS", "ACCOUNTS", "FLAGS")
    for known in reservations:
        table.add_row(
            known["name"],
            known["state"],
            when(known["start"]),
            when(known["end"]),
            str(len(known["gpus"])),
            ",".join(known["nodes"]),
            ",".join(known["users"]) or "-",
            ",".join(known["accounts"]) or "-",
            ",".join(known["flags"]) or "-",
        )
    return table


def _details(known: Reservation) -> Table:
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    gpus = ", ".join(f"{g['node']}/{g['index']}" for g in known["gpus"])
    for key, value in (
        ("name", known["name"]),
        ("state", known["state"]),
        ("start", when(known["start"])),
        ("end", when(known["end"])),
        ("gpus", f"{len(known['gpus'])}: {gpus}"),
        ("users", ",".join(known["users"]) or "-"),
        ("accounts", ",".join(known["accounts"]) or "-"),
        ("flags", ",".join(known["flags"]) or "-"),
        ("description", known["description"] or "-"),
    ):
        table.add_row(key, value)
    return table


def _show(answer: Reservation, as_json: bool) -> None:
    if as_json:
        print_json(answer)
    else:
        emit(_details(answer))


@reservation_app.command("list")
def list_reservations(ctx: typer.Context, as_json: JsonFlag = False) -> None:
    """Every reservation that has not ended."""
    with gateway(ctx) as client:
        answer: ReservationList = client.reservations()
    if as_json:
        print_json(answer)
    else:
        emit(_table(answer["reservations"]))


@reservation_app.command("show")
def show_reservation(ctx: typer.Context, name: Name, as_json: JsonFlag = False) -> None:
    """One reservation, with each GPU it holds."""
    with gateway(ctx) as client:
        answer = client.reservation(name)
    _show(answer, as_json)


Start = Annotated[
    str | None, typer.Option(help="now, now+DURATION, or an ISO 8601 time (local without offset).")
]
End = Annotated[str | None, typer.Option(help="ISO 8601 time, or now+DURATION.")]
Duration = Annotated[str | None, typer.Option(help="Instead of --end: 90 (s), 45m, 8h, 1d12h.")]
Nodes = Annotated[str | None, typer.Option(help="Every GPU of these nodes, comma-separated.")]
Gpus = Annotated[
    int | None, typer.Option(min=1, help="Instead of --nodes: this many GPUs, chosen for you.")
]
GpuModel = Annotated[
    list[str] | None, typer.Option("--gpu-model", help="With --gpus: a model (repeatable).")
]
Pool = Annotated[str | None, typer.Option(help="With --gpus: physical, vgpu or any.")]
Topology = Annotated[
    str | None, typer.Option(help="With --gpus: all inside one domain of this topology level.")
]
Users = Annotated[str | None, typer.Option(help="Users who may run jobs in it, comma-separated.")]
Accounts = Annotated[
    str | None, typer.Option(help="Accounts whose jobs may run in it, comma-separated.")
]
Description = Annotated[str | None, typer.Option(help="What it is for.")]


def _body(
    *,
    start: str | None,
    end: str | None,
    duration: str | None,
    nodes: str | None,
    gpus: int | None,
    gpu_model: list[str] | None,
    pool: str | None,
    topology: str | None,
    users: str | None,
    accounts: str | None,
    description: str | None,
) -> dict[str, Any]:
    """The JSON body of the options given (None: not given, left out)."""
    if end is not None and duration is not None:
        raise typer.BadParameter("give --end or --duration, not both")
    if nodes is not None and gpus is not None:
        raise typer.BadParameter("give --nodes or --gpus, not both")
    if gpus is None and (gpu_model or pool or topology):
        raise typer.BadParameter("--gpu-model, --pool and --topology go with --gpus")
    ask = {"count": gpus, "gpu_model": gpu_model or [], "pool": pool, "topology_level": topology}
    body = {
        "start": parse_time(start) if start is not None else None,
        "end": parse_time(end) if end is not None else None,
        "duration_s": parse_duration(duration) if duration is not None else None,
        "nodes": _names(nodes),
        "gpus": {k: v for k, v in ask.items() if v is not None} if gpus is not None else None,
        "users": _names(users),
        "accounts": _names(accounts),
        "description": description,
    }
    return {key: value for key, value in body.items() if value is not None}


@reservation_app.command("create")
def create_reservation(
    ctx: typer.Context,
    name: Name,
    start: Start = "now",
    end: End = None,
    duration: Duration = None,
    nodes: Nodes = None,
    gpus: Gpus = None,
    gpu_model: GpuModel = None,
    pool: Pool = None,
    topology: Topology = None,
    users: Users = None,
    accounts: Accounts = None,
    maint: Annotated[
        bool, typer.Option("--maint", help="A maintenance window: no job runs in it.")
    ] = False,
    ignore_jobs: Annotated[
        bool,
        typer.Option(
            "--ignore-jobs", help="Make it although running jobs may hold its GPUs at its start."
        ),
    ] = False,
    description: Description = None,
    as_json: JsonFlag = False,
) -> None:
    """Make a reservation (operators): --end or --duration, and --nodes or --gpus."""
    if end is None and duration is None:
        raise typer.BadParameter("give --end or --duration")
    if nodes is None and gpus is None:
        raise typer.BadParameter("give --nodes or --gpus")
    body = _body(
        start=start, end=end, duration=duration, nodes=nodes, gpus=gpus, gpu_model=gpu_model,
        pool=pool, topology=topology, users=users, accounts=accounts, description=description,
    )  # fmt: skip
    flags = [flag for flag, on in (("ignore_jobs", ignore_jobs), ("maint", maint)) if on]
    with gateway(ctx) as client:
        answer = client.create_reservation({"name": name, **body, "flags": flags})
    _show(answer, as_json)


@reservation_app.command("update")
def update_reservation(
    ctx: typer.Context,
    name: Name,
    start: Start = None,
    end: End = None,
    duration: Duration = None,
    nodes: Nodes = None,
    gpus: Gpus = None,
    gpu_model: GpuModel = None,
    pool: Pool = None,
    topology: Topology = None,
    users: Users = None,
    accounts: Accounts = None,
    maint: Annotated[
        bool | None,
        typer.Option("--maint/--no-maint", help="Make it a maintenance window, or not."),
    ] = None,
    ignore_jobs: Annotated[
        bool | None,
        typer.Option("--ignore-jobs/--no-ignore-jobs", help="Set or clear the ignore_jobs flag."),
    ] = None,
    description: Description = None,
    as_json: JsonFlag = False,
) -> None:
    """Change a reservation (operators): each option given replaces its own; a new start
    alone keeps the duration; --nodes or --gpus choose its GPUs again."""
    body = _body(
        start=start, end=end, duration=duration, nodes=nodes, gpus=gpus, gpu_model=gpu_model,
        pool=pool, topology=topology, users=users, accounts=accounts, description=description,
    )  # fmt: skip
    with gateway(ctx) as client:
        if maint is not None or ignore_jobs is not None:
            flags = set(client.reservation(name)["flags"])
            for flag, on in (("maint", maint), ("ignore_jobs", ignore_jobs)):
                if on is not None:
                    flags = flags | {flag} if on else flags - {flag}
            body["flags"] = sorted(flags)
        answer = client.update_reservation(name, body)
    _show(answer, as_json)


@reservation_app.command("delete")
def delete_reservation(ctx: typer.Context, name: Name, as_json: JsonFlag = False) -> None:
    """Remove a reservation (operators): its waiting jobs are cancelled, running ones run
    on."""
    with gateway(ctx) as client:
        client.delete_reservation(name)
    if as_json:
        print_json({"deleted": name})
    else:
        emit(f"reservation {escape(name)} deleted")

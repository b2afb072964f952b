"""`gpuloom archive ...`: the log's sealed segments in files (`gpuloom.bus.archive`).

    gpuloom archive export --to /backup/gpuloom-log     # append what is new
    gpuloom archive verify /backup/gpuloom-log          # every segment against its sha256

Run it as the operator, with the admin's NATS URL (`make run` writes it in
`.gpuloom/stack.json`, which is found by default).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from gpuloom.bus.archive import SEGMENT_EVENTS, ArchiveError, export, verify_archive
from gpuloom.bus.credentials import connect_options
from gpuloom.bus.jetstream import EventBus
from gpuloom.client.context import emit, fail
from gpuloom.client.logcmds import resolve_nats_url
from gpuloom.config import load_settings
from gpuloom.natsserver import strip_credentials

app = typer.Typer(help="The log's sealed segments in files: the audit trail outside the stream.")


async def _export(url: str, root: Path, upto: int | None, segment_events: int) -> str:
    settings = load_settings()
    bus = await EventBus.connect(
        url, settings.stream, name="gpuloom-archive", create=False, **connect_options(settings)
    )
    try:
        written = await export(bus, root, upto, segment_events)
    finally:
        await bus.close()
    if not written:
        return f"nothing new to export into {root}"
    return (
        f"exported seq {written[0].first}..{written[-1].last} "
        f"({sum(s.count for s in written)} events) into {len(written)} segment(s) in {root}"
    )


@app.command("export")
def export_command(
    to: Annotated[Path, typer.Option("--to", help="the archive folder (made if missing)")],
    upto: Annotated[int | None, typer.Option(help="export up to this sequence")] = None,
    segment_events: Annotated[
        int, typer.Option(min=1, help="events per segment file")
    ] = SEGMENT_EVENTS,
    nats: Annotated[str | None, typer.Option("--nats", help="NATS URL of the log")] = None,
) -> None:
    """Append the stream's events after the archive's last as new sealed segments."""
    try:
        url = resolve_nats_url(nats)
    except ValueError as exc:
        fail(str(exc), 2)
    try:
        emit(asyncio.run(_export(url, to, upto, segment_events)))
    except ArchiveError as exc:
        fail(str(exc))
    except Exception as exc:
        fail(f"cannot export the log at {strip_credentials(url)}: {exc}")


@app.command("verify")
def verify_command(
    root: Annotated[Path, typer.Argument(help="the archive folder")],
) -> None:
    """Read every segment back against the manifest's sha256; exit 1 at the first bad one."""
    try:
        report = verify_archive(root)
    except ArchiveError as exc:
        fail(str(exc))
    emit(
        f"{root}: {report.segments} segment(s), seq {report.first}..{report.last}, "
        f"{report.events} events, {report.bytes} bytes: every segment verified"
    )

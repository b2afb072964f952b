"""`gpuloom archive ...`: the log's sealed segments in files (`gpuloom.bus.archive`).

    gpuloom archive export --to /backup/gpuloom-log     # append what is new
    gpuloom archive verify /backup/gpuloom-log          # every segment against its sha256
    gpuloom archive drop --archive /backup/gpuloom-log --upto SEQ

Run it as the operator, with the admin's NATS URL (`make run` writes it in
`.gpuloom/stack.json`, which is found by default).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated

import typer

from gpuloom.bus.archive import (
    SEGMENT_EVENTS,
    ArchiveError,
    export,
    load_manifest,
    read_archive,
    verify_archive,
)
from gpuloom.bus.credentials import connect_options
from gpuloom.bus.jetstream import EventBus
from gpuloom.bus.jsapi import BASE_BUCKET
from gpuloom.client.context import emit, fail
from gpuloom.client.logcmds import resolve_nats_url
from gpuloom.config import load_settings
from gpuloom.natsserver import strip_credentials
from gpuloom.runtime.follower import LogFollower
from gpuloom.state import ClusterState
from gpuloom.state.snapshot import decode_snapshot, encode_snapshot

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


async def _drop(url: str, root: Path, upto: int) -> str:
    """Fold the archive to `upto`, store it as the base snapshot, then drop the stream's
    events up to it. Every check comes before anything is changed."""
    settings = load_settings()
    bus = await EventBus.connect(
        url, settings.stream, name="gpuloom-archive", create=False, **connect_options(settings)
    )
    try:
        figures = await bus.stream_figures()
        if upto < figures.first_seq:
            return f"the stream already starts at seq {figures.first_seq}: nothing to drop"
        if upto > figures.last_seq:
            raise ArchiveError(f"seq {upto} is past the log's last, {figures.last_seq}")
        report = verify_archive(root)
        if report.last < upto:
            raise ArchiveError(f"the archive ends at seq {report.last}: export up to {upto} first")
        base = bus.snapshot_store("base", bucket=BASE_BUCKET, keep=2, create=True)
        state = ClusterState()
        if report.first > 1:  # an archive begun after an earlier drop: from its base
            earlier = [s for s in await base.stored() if s.seq == report.first - 1]
            if not earlier:
                raise ArchiveError(
                    f"the archive starts at seq {report.first} and no base snapshot at seq "
                    f"{report.first - 1} is stored: cannot fold the log before it"
                )
            state = decode_snapshot(await base.read(earlier[0]), figures.created)
        folder = LogFollower(None, "archive", state=state)  # folds as every process does
        for message in read_archive(root, upto):
            folder.fold(message)
        state = folder.state
        state.seq = max(state.seq, upto)
        stored = await base.write(upto, encode_snapshot(state, figures.created))
        await bus.purge_before(upto + 1)
        after = await bus.stream_figures()
    finally:
        await bus.close()
    return (
        f"base snapshot at seq {stored.seq} ({stored.size} bytes, {len(state.jobs)} live jobs) "
        f"stored in {BASE_BUCKET}; the stream now starts at seq {after.first_seq} "
        f"({after.messages} events, {after.bytes} bytes); the archive in {root} keeps the rest"
    )


@app.command("drop")
def drop_command(
    archive: Annotated[Path, typer.Option("--archive", help="the archive folder (exported)")],
    upto: Annotated[int, typer.Option(min=1, help="drop the stream's events up to this seq")],
    nats: Annotated[str | None, typer.Option("--nats", help="NATS URL of the log")] = None,
) -> None:
    """Drop the stream's events up to SEQ once the archive holds them: first the fold of
    the log up to SEQ is stored as the base snapshot every process can start from."""
    try:
        url = resolve_nats_url(nats)
    except ValueError as exc:
        fail(str(exc), 2)
    if not load_manifest(archive):
        fail(f"{archive}: no archive there (gpuloom archive export --to {archive})")
    try:
        emit(asyncio.run(_drop(url, archive, upto)))
    except ArchiveError as exc:
        fail(str(exc))
    except Exception as exc:
        fail(f"cannot drop from the log at {strip_credentials(url)}: {exc}")

"""`gpuloom audit` and `gpuloom replay`: commands that read the event log itself.

They find the log of the stack `make run` started (its `.gpuloom/stack.json`)
without flags, or any other with `--nats` / `GPULOOM_NATS_URL`.

Both use the services' snapshots (`GPULOOM_SNAP_*` buckets). `gpuloom audit` folds
from sequence 1 by default and proves every snapshot it reads on the way (each must
be the fold of the log up to its sequence); `--from-snapshot` starts from the newest
trusted one instead. `gpuloom replay` starts from the newest trusted snapshot at or
before the point asked, unless `--from-start`. The snapshots are read before the
log, so that none the services write meanwhile lies past the log read.
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.markup import escape
from rich.table import Table

from gpuloom.audit import (
    AuditReport,
    SnapshotCheck,
    SnapshotClaim,
    Start,
    audit,
    newest_trusted,
    snapshot,
    state_at,
)
from gpuloom.audit.workers import usable_cpus
from gpuloom.bus.archive import ArchiveError
from gpuloom.bus.reader import SnapshotRead, read_history, read_log, read_snapshots
from gpuloom.bus.streams import StreamMissingError
from gpuloom.client.context import emit, err, fail, print_json
from gpuloom.events import AuditCompleted, Recorded, encode, make_envelope, subject_for
from gpuloom.events.codec import new_event_id
from gpuloom.natsserver import strip_credentials

NatsOption = Annotated[
    str | None,
    typer.Option("--nats", help="NATS URL of the log (default: GPULOOM_NATS_URL, then make run's)"),
]


ArchiveOption = Annotated[
    Path | None,
    typer.Option(
        "--archive",
        help="the log's archive (gpuloom archive export): read the events the stream dropped",
    ),
]


def resolve_nats_url(url: str | None, env: dict[str, str] | None = None) -> str:
    """`url`, else GPULOOM_NATS_URL, else the NATS of the stack `make run` started here."""
    env = dict(os.environ) if env is None else env
    if url:
        return url
    if env.get("GPULOOM_NATS_URL"):
        return env["GPULOOM_NATS_URL"]
    stack = Path(env.get("GPULOOM_DATA_DIR", ".gpuloom")) / "stack.json"
    if stack.exists():
        found: str = json.loads(stack.read_text())["nats_url"]
        return found
    raise ValueError(
        "no event log found: set GPULOOM_NATS_URL or --nats, or run from the folder of `make run`"
    )


def _url(url: str | None) -> str:
    try:
        return resolve_nats_url(url)
    except ValueError as exc:
        fail(str(exc), 2)


def _read(
    url: str | None, upto: int | None = None, from_seq: int = 1, archive: Path | None = None
) -> list[Recorded]:
    nats_url = _url(url)
    try:
        if archive is not None:
            return asyncio.run(read_history(nats_url, archive, upto=upto, from_seq=from_seq))
        return asyncio.run(read_log(nats_url, upto=upto, from_seq=from_seq))
    except ArchiveError as exc:
        fail(f"cannot read the archive: {exc}")
    except Exception as exc:
        fail(f"cannot read the log at {strip_credentials(nats_url)}: {exc}")


def _source(read: SnapshotRead) -> str:
    """Whose snapshot, as reports name it: a service, or an agent with its bucket."""
    return read.service if read.service != "agent" else f"agent ({read.bucket})"


def _snapshots(url: str | None) -> tuple[list[SnapshotClaim], list[SnapshotCheck]]:
    """The snapshots of every bucket as claims to prove, and those that could not be
    read (as skipped checks). Fails the command only where there is no log at all:
    snapshots that cannot be listed or read are warned about, and an audit or a
    replay without them folds from sequence 1 as it always could."""
    nats_url = _url(url)
    try:
        reads, problems = asyncio.run(read_snapshots(nats_url))
    except StreamMissingError as exc:  # pointed at the wrong NATS: say it once, as _read would
        fail(f"cannot read the log at {strip_credentials(nats_url)}: {exc}")
    except Exception as exc:
        reads, problems = [], [f"cannot read the snapshot buckets: {exc!r}"]
    for problem in problems:
        err.print(f"[yellow]warning: {escape(problem)}[/yellow]")
    claims, unread = [], []
    for read in reads:
        if read.data is None:
            unread.append(
                SnapshotCheck(
                    read.bucket, _source(read), read.name, read.seq, "skipped", read.error
                )
            )
        else:
            claims.append(SnapshotClaim(read.bucket, _source(read), read.name, read.seq, read.data))
    return claims, unread


async def _record(url: str, event: AuditCompleted) -> int:
    from gpuloom.bus import EventBus, Outgoing
    from gpuloom.bus.credentials import connect_options
    from gpuloom.config import load_settings

    bus = await EventBus.connect(
        url, "GPULOOM", name="gpuloom-audit", **connect_options(load_settings())
    )
    try:
        envelope = make_envelope(event, at=datetime.now(UTC), by="audit")
        message = Outgoing(subject_for(event), encode(envelope), {"Nats-Msg-Id": envelope.id})
        seq, _ = await bus.publish(message)
        return seq
    finally:
        await bus.close()


def audit_command(
    nats: NatsOption = None,
    from_seq: Annotated[int, typer.Option("--from", help="audit decisions from this seq")] = 0,
    from_snapshot: Annotated[
        bool,
        typer.Option(
            "--from-snapshot",
            help="fold from the newest trusted snapshot, not seq 1: audit the decisions after it",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="the report as JSON")] = False,
    archive: ArchiveOption = None,
    record: Annotated[
        bool, typer.Option(help="write the result to the log (GET /v1/audit shows it)")
    ] = True,
    workers: Annotated[
        int,
        typer.Option(
            min=0, help="processes that share the work (0: one per CPU this process may use)"
        ),
    ] = 0,
) -> None:
    """Re-make every placement decision from the log and check it matches, and prove the
    services' snapshots (each the fold of the log up to its seq); exit 1 if not."""
    claims, unread = _snapshots(nats)
    start: Start | None = None
    if from_snapshot:
        start, _ = newest_trusted(claims)  # those it passed over the audit reports
        if start is None:
            err.print("[yellow]no trusted snapshot: auditing from seq 1[/yellow]")
        else:
            claims = [claim for claim in claims if claim is not start.claim]
    begin = start.state.seq if start is not None else 0
    records = _read(nats, from_seq=begin + 1, archive=archive)
    report = audit(
        records,
        from_seq=from_seq,
        start=start.state if start is not None else None,
        snapshots=claims,
        workers=workers or usable_cpus(),
    )
    report.snapshots[:0] = unread
    if as_json:
        print_json(_report_json(report, start))
    else:
        _print_report(report, start)
    if record:
        event = AuditCompleted(
            audit_id=new_event_id(),
            from_seq=report.from_seq,
            to_seq=report.to_seq,
            verified=report.verified,
            mismatch_count=len(report.mismatches),
            mismatches=report.mismatches[:50],
            seconds=round(report.seconds, 3),
        )
        try:
            asyncio.run(_record(resolve_nats_url(nats), event))
        except Exception as exc:
            err.print(f"[yellow]warning: the result was not written to the log: {exc}[/yellow]")
    if not report.ok:
        raise typer.Exit(1)


def _report_json(report: AuditReport, start: Start | None) -> dict[str, Any]:
    return {
        "from_seq": report.from_seq,
        "to_seq": report.to_seq,
        "verified": report.verified,
        "mismatches": report.mismatches,
        "seconds": round(report.seconds, 3),
        "workers": report.workers,
        "start": None
        if start is None
        else {"bucket": start.claim.bucket, "name": start.claim.name, "seq": start.claim.seq},
        "before_start": report.before_start,
        "snapshots": [check.as_json() for check in report.snapshots],
    }


def _print_report(report: AuditReport, start: Start | None) -> None:
    rate = report.verified / report.seconds if report.seconds else 0.0
    if start is not None:
        err.print(
            f"from the snapshot of {escape(start.claim.source)} at seq {start.claim.seq} "
            f"({start.claim.name}): decisions at or before it are not re-made, and the "
            "snapshots after it are proved against the fold from it"
        )
    err.print(
        f"audited seqs {report.from_seq}..{report.to_seq}: {report.verified} decisions "
        f"verified, {len(report.mismatches)} mismatches ({report.seconds:.2f} s, "
        f"{rate:.0f} decisions/s, {report.workers} process{'es' if report.workers > 1 else ''})"
    )
    if report.before_start:
        err.print(
            f"{report.before_start} decisions after the snapshot were made on a state "
            "before it: not re-made (audit without --from-snapshot to check them)"
        )
    proved, skipped = report.proved, report.skipped
    differs = len(report.snapshots) - len(proved) - len(skipped)
    err.print(
        f"snapshots: {len(proved)} proved, {differs} differ from the fold, {len(skipped)} skipped"
    )
    for check in proved:
        err.print(f"proved {escape(check.line())}")
    for check in skipped:
        err.print(f"[yellow]{escape(check.line())}[/yellow]")
    for line in report.mismatches[:50]:
        err.print(f"[red]mismatch[/red] {escape(line)}")


def parse_at(text: str) -> tuple[int | None, datetime | None]:
    """A sequence number, or an ISO time (UTC when no zone is given)."""
    if text.isdigit():
        return int(text), None
    try:
        when = datetime.fromisoformat(text)
    except ValueError:
        raise typer.BadParameter(f"{text!r} is neither a sequence number nor an ISO time") from None
    return None, when if when.tzinfo else when.replace(tzinfo=UTC)


def replay_command(
    at: Annotated[str, typer.Option("--at", help="a seq, or a time like 2026-12-03T10:00:00")],
    nats: NatsOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="the snapshot as JSON")] = False,
    from_start: Annotated[
        bool,
        typer.Option("--from-start", help="fold from seq 1, not from the newest snapshot before"),
    ] = False,
    archive: ArchiveOption = None,
) -> None:
    """The cluster as it was at a seq or a time: nodes, GPUs, pools, holders, queue.

    Starts from the newest trusted snapshot at or before that point (for a time: one
    whose log clock is not past it), so that last week's cluster does not cost a
    fold of the whole year; `--from-start` folds from seq 1."""
    seq, when = parse_at(at)
    start: Start | None = None
    if not from_start:
        claims, unread = _snapshots(nats)
        start, untrusted = newest_trusted(claims, seq=seq, at=when)
        for check in [*unread, *untrusted]:
            err.print(f"[yellow]{escape(check.line())}[/yellow]")
    begin = start.state.seq if start is not None else 0
    if start is None:
        err.print("replayed from seq 1")
    else:
        err.print(f"replayed from the snapshot of {escape(start.claim.source)} at seq {begin}")
    records = _read(nats, upto=seq, from_seq=begin + 1, archive=archive)
    state = state_at(records, seq=seq, at=when, start=start.state if start is not None else None)
    view = snapshot(state)
    if as_json:
        print_json(view.as_json())
        return
    emit(_nodes_table(view.nodes, view.seq), _queue_table(view.queue, view.running))


def _nodes_table(nodes: list[dict[str, Any]], seq: int) -> Table:
    table = Table(title=f"cluster at seq {seq}")
    for column in ["node", "state", "gpu", "model", "pool", "milli used", "memory used", "held by"]:
        table.add_column(column)
    for node in nodes:
        for gpu in node["gpus"]:
            table.add_row(
                node["name"],
                node["state"],
                str(gpu["index"]),
                gpu["model"],
                gpu["pool"],
                str(gpu["milli_allocated"]),
                str(gpu["memory_allocated_mib"]),
                ", ".join(gpu["holders"]) or "-",
            )
    return table


def _queue_table(queue: list[dict[str, Any]], running: list[dict[str, Any]]) -> Table:
    table = Table(title=f"{len(running)} placed or running, {len(queue)} queued")
    for column in ["job", "state", "node", "priority"]:
        table.add_column(column)
    for job in running:
        table.add_row(job["id"], job["state"], job["node"] or "-", str(job["priority"]))
    for job in queue:
        table.add_row(job["id"], "queued", "-", str(job["priority"]))
    return table

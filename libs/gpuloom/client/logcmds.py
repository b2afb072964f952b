"""`gpuloom audit` and `gpuloom replay`: commands that read the event log itself.

They find the log of the stack `make run` started (its `.gpuloom/stack.json`)
without flags, or any other with `--nats` / `GPULOOM_NATS_URL`.
"""

from __future__ import annotations

import asyncio
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from gpuloom.audit import audit, snapshot, state_at
from gpuloom.bus.reader import read_log
from gpuloom.client.context import emit, err, fail, print_json
from gpuloom.events import AuditCompleted, Recorded, encode, make_envelope, subject_for
from gpuloom.events.codec import new_event_id
from gpuloom.natsserver import strip_credentials

NatsOption = Annotated[
    str | None,
    typer.Option("--nats", help="NATS URL of the log (default: GPULOOM_NATS_URL, then make run's)"),
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


def _read(url: str | None, upto: int | None = None) -> list[Recorded]:
    try:
        nats_url = resolve_nats_url(url)
    except ValueError as exc:
        fail(str(exc), 2)
    try:
        return asyncio.run(read_log(nats_url, upto=upto))
    except Exception as exc:
        fail(f"cannot read the log at {strip_credentials(nats_url)}: {exc}")


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
    as_json: Annotated[bool, typer.Option("--json", help="the report as JSON")] = False,
    record: Annotated[
        bool, typer.Option(help="write the result to the log (GET /v1/audit shows it)")
    ] = True,
) -> None:
    """Re-make every placement decision from the log and check it matches; exit 1 if not."""
    records = _read(nats)
    report = audit(records, from_seq=from_seq)
    if as_json:
        print_json(
            {
                "from_seq": report.from_seq,
                "to_seq": report.to_seq,
                "verified": report.verified,
                "mismatches": report.mismatches,
                "seconds": round(report.seconds, 3),
            }
        )
    else:
        rate = report.verified / report.seconds if report.seconds else 0.0
        err.print(
            f"audited seqs {report.from_seq}..{report.to_seq}: {report.verified} decisions "
            f"verified, {len(report.mismatches)} mismatches ({report.seconds:.2f} s, "
            f"{rate:.0f} decisions/s)"
        )
        for line in report.mismatches[:50]:
            err.print(f"[red]mismatch[/red] {line}")
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
) -> None:
    """The cluster as it was at a seq or a time: nodes, GPUs, pools, holders, queue."""
    seq, when = parse_at(at)
    records = _read(nats, upto=seq)
    view = snapshot(state_at(records, seq=seq, at=when))
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
        table.add_row(job["id"], job["state"], job["node"] or "-", "")
    for job in queue:
        table.add_row(job["id"], "queued", "-", str(job["priority"]))
    return table

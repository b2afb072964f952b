"""The log exported into sealed segment files, against the real nats-server: appended,
never rewritten, read back byte for byte, and refused when tampered with."""

from __future__ import annotations

import asyncio
import gzip
from pathlib import Path

import pytest
from projection_helpers import put, submit
from typer.testing import CliRunner

from gpuloom.bus import EventBus, Incoming
from gpuloom.bus.archive import ArchiveError, export, load_manifest, read_archive, verify_archive
from gpuloom.bus.reader import LogStartDropped, read_history
from gpuloom.client.cli import app
from gpuloom.events import decode

pytestmark = pytest.mark.integration


async def _stream(bus: EventBus, last: int) -> list[tuple[int, str, bytes]]:
    """The stream's messages, as an ordered consumer delivers them."""
    got: list[tuple[int, str, bytes]] = []
    done = asyncio.Event()

    async def on_message(message: Incoming) -> None:
        got.append((message.seq, message.subject, message.body))
        if message.seq >= last:
            done.set()

    unsubscribe = await bus.follow(on_message)
    await asyncio.wait_for(done.wait(), 10)
    await unsubscribe()
    return got


async def test_segments_are_appended_and_read_back_as_the_stream_held_them(
    bus: EventBus, tmp_path: Path
) -> None:
    root = tmp_path / "archive"
    await put(bus, *(submit(f"arch-{i}") for i in range(8)))
    first = await export(bus, root, segment_events=3)
    assert [(s.first, s.last) for s in first] == [(1, 3), (4, 6), (7, 8)]
    assert await export(bus, root) == []  # nothing new: nothing written

    last = await put(bus, submit("arch-8"), submit("arch-9"))
    sealed = {s.file: (root / s.file).read_bytes() for s in first}
    more = await export(bus, root, segment_events=3)
    assert [(s.first, s.last) for s in more] == [(9, last)]
    assert {s.file: (root / s.file).read_bytes() for s in first} == sealed  # never rewritten

    archived = [(m.seq, m.subject, m.body) for m in read_archive(root)]
    assert archived == await _stream(bus, last)
    report = verify_archive(root)
    assert (report.segments, report.first, report.last, report.events) == (4, 1, last, last)
    jobs = [decode(m.seq, m.body, m.stored_at, subject=m.subject) for m in read_archive(root, 5)]
    assert [r.event.job_id for r in jobs] == [f"arch-{i}" for i in range(5)]  # type: ignore[attr-defined]


async def test_a_tampered_or_missing_segment_is_refused(bus: EventBus, tmp_path: Path) -> None:
    root = tmp_path / "archive"
    await put(bus, *(submit(f"t-{i}") for i in range(6)))
    segments = await export(bus, root, segment_events=2)
    victim = root / segments[1].file
    lines = gzip.decompress(victim.read_bytes()).replace(b"t-2", b"t-X")
    victim.write_bytes(gzip.compress(lines))
    with pytest.raises(ArchiveError, match=f"segment {segments[1].file}: its sha256"):
        verify_archive(root)
    victim.unlink()
    with pytest.raises(ArchiveError, match=segments[1].file):
        verify_archive(root)


async def test_an_export_after_events_were_dropped_unexported_is_refused(
    bus: EventBus, tmp_path: Path
) -> None:
    root = tmp_path / "archive"
    await put(bus, *(submit(f"d-{i}") for i in range(4)))
    await export(bus, root)
    await put(bus, *(submit(f"e-{i}") for i in range(4)))
    await bus.js.purge_stream("GPULOOM", seq=7)  # seq 5 and 6 leave the stream unexported
    with pytest.raises(ArchiveError, match=r"events 5\.\.6 were dropped before they were exported"):
        await export(bus, root)
    assert [s.last for s in load_manifest(root)] == [4]


async def test_history_reads_the_archive_then_the_stream_and_names_a_gap(
    nats_url: str, bus: EventBus, tmp_path: Path
) -> None:
    root = tmp_path / "archive"
    with pytest.raises(ArchiveError, match="no segments"):
        await read_history(nats_url, root)
    await put(bus, *(submit(f"h-{i}") for i in range(6)))
    await export(bus, root, segment_events=2)
    last = await put(bus, *(submit(f"h-{i}") for i in range(6, 9)))
    await bus.js.purge_stream("GPULOOM", seq=5)  # seq 1..4 only in the archive now
    jobs = [r.event.job_id for r in await read_history(nats_url, root)]  # type: ignore[attr-defined]
    assert jobs == [f"h-{i}" for i in range(9)]
    middle = await read_history(nats_url, root, from_seq=3, upto=7)
    assert [r.seq for r in middle] == [3, 4, 5, 6, 7]
    await put(bus, submit("h-9"))
    await bus.js.purge_stream("GPULOOM", seq=last + 1)  # 7..9 dropped, never exported
    with pytest.raises(LogStartDropped, match="--archive"):
        await read_history(nats_url, root)


def test_the_cli_exports_and_verifies(nats_url: str, tmp_path: Path) -> None:
    async def fill() -> None:
        connected = await EventBus.connect(nats_url, "GPULOOM", name="filler")
        await put(connected, *(submit(f"c-{i}") for i in range(5)))
        await connected.close()

    asyncio.run(fill())
    root = tmp_path / "archive"
    runner = CliRunner()
    done = runner.invoke(app, ["archive", "export", "--to", str(root), "--nats", nats_url])
    assert done.exit_code == 0, done.output
    assert "exported seq 1..5 (5 events) into 1 segment(s)" in done.output
    checked = runner.invoke(app, ["archive", "verify", str(root)])
    assert checked.exit_code == 0, checked.output
    assert "1 segment(s), seq 1..5, 5 events" in checked.output
    (root / load_manifest(root)[0].file).write_bytes(b"not gzip")
    refused = runner.invoke(app, ["archive", "verify", str(root)])
    assert refused.exit_code == 1 and "sha256" in refused.output, refused.output

"""The log's sealed segments in files: the audit trail kept outside the stream.

The stream keeps every event by default: it is the audit trail. An
operator who must bound its size first exports the events, in order, into segment
files that never change once written (`seg-<first>-<last>.jsonl.gz`: one JSON line
per message with its sequence, subject, headers, the time the stream stored it and
its bytes, base64), listed with their sha256 in `manifest.json`. A later export
appends new segments after the last one; nothing is rewritten. `verify_archive`
checks every segment against the manifest and that the sequences follow each other,
and `read_archive` gives the messages back exactly as the stream held them, so that
audit and replay can fold them as they fold the stream.

A segment is written to a temporary file, flushed to disk and renamed; the manifest
likewise, after its segment: a crash leaves at worst a stray temporary file, never a
manifest naming a segment that is not whole.
"""

from __future__ import annotations

import asyncio
import base64
import fcntl
import gzip
import hashlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from gpuloom.bus.jetstream import EventBus
from gpuloom.bus.messages import Incoming

FORMAT = "gpuloom-log-archive"
VERSION = 1
MANIFEST = "manifest.json"
#: Events per segment: about 50 MB of JSON before compression, a few MB after.
SEGMENT_EVENTS = 100_000


class ArchiveError(Exception):
    """The archive cannot be trusted or extended; the message says why."""


@dataclass(frozen=True, slots=True)
class Segment:
    file: str
    first: int
    last: int
    count: int
    sha256: str
    bytes: int


def load_manifest(root: Path) -> list[Segment]:
    """The segments the manifest lists, in order ([] for a folder with none)."""
    path = root / MANIFEST
    if not path.exists():
        return []
    try:
        doc = json.loads(path.read_text())
        if doc.get("format") != FORMAT or doc.get("version") != VERSION:
            raise ArchiveError(
                f"{path}: not a {FORMAT} manifest of version {VERSION} "
                f"(format {doc.get('format')!r}, version {doc.get('version')!r})"
            )
        return [Segment(**entry) for entry in doc["segments"]]
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise ArchiveError(f"{path}: unreadable manifest: {exc!r}") from exc


def _write_durably(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    with open(temporary, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)
    finally:
        os.close(directory)


def _line(message: Incoming) -> bytes:
    return json.dumps(
        {
            "seq": message.seq,
            "subject": message.subject,
            "headers": message.headers,
            "stored_at": message.stored_at.isoformat() if message.stored_at else None,
            "data": base64.b64encode(message.body).decode(),
        },
        separators=(",", ":"),
    ).encode()


def _message(line: bytes) -> Incoming:
    entry: dict[str, Any] = json.loads(line)
    stored = entry["stored_at"]
    return Incoming(
        seq=int(entry["seq"]),
        subject=str(entry["subject"]),
        body=base64.b64decode(entry["data"], validate=True),
        headers=dict(entry["headers"]),
        pending=0,
        stored_at=datetime.fromisoformat(stored) if stored else None,
    )


def write_segment(root: Path, messages: Sequence[Incoming], segments: list[Segment]) -> Segment:
    """Seal `messages` (consecutive, after the last segment) into a new segment file and
    list it in the manifest."""
    first, last = messages[0].seq, messages[-1].seq
    if segments and first != segments[-1].last + 1:
        raise ArchiveError(f"segment starting at {first} does not follow {segments[-1].last}")
    if [m.seq for m in messages] != list(range(first, last + 1)):
        raise ArchiveError(f"the stream has a gap between seq {first} and {last}: not sealed")
    lines = b"\n".join(_line(m) for m in messages) + b"\n"
    data = gzip.compress(lines, compresslevel=6, mtime=0)  # the same events, the same bytes
    name = f"seg-{first:015d}-{last:015d}.jsonl.gz"
    _write_durably(root / name, data)
    segment = Segment(name, first, last, len(messages), hashlib.sha256(data).hexdigest(), len(data))
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "segments": [asdict(s) for s in [*segments, segment]],
    }
    _write_durably(root / MANIFEST, json.dumps(manifest, indent=1).encode())
    segments.append(segment)
    return segment


def _segment_messages(root: Path, segment: Segment) -> list[Incoming]:
    path = root / segment.file
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise ArchiveError(f"segment {segment.file}: {exc}") from exc
    if hashlib.sha256(data).hexdigest() != segment.sha256:
        raise ArchiveError(f"segment {segment.file}: its sha256 is not the manifest's")
    try:
        messages = [_message(line) for line in gzip.decompress(data).splitlines() if line]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ArchiveError(f"segment {segment.file}: unreadable: {exc}") from exc
    seqs = [m.seq for m in messages]
    if seqs != list(range(segment.first, segment.last + 1)) or len(seqs) != segment.count:
        raise ArchiveError(
            f"segment {segment.file}: holds sequences other than {segment.first}..{segment.last}"
        )
    return messages


def read_archive(root: Path, upto: int | None = None) -> Iterator[Incoming]:
    """Every archived message up to `upto`, in order, each segment checked first."""
    previous: int | None = None
    for segment in load_manifest(root):
        if previous is not None and segment.first != previous + 1:
            raise ArchiveError(f"segment {segment.file} does not follow seq {previous}")
        previous = segment.last
        if upto is not None and segment.first > upto:
            return
        for message in _segment_messages(root, segment):
            if upto is not None and message.seq > upto:
                return
            yield message


@dataclass(frozen=True, slots=True)
class ArchiveReport:
    segments: int
    first: int
    last: int
    events: int
    bytes: int


def verify_archive(root: Path) -> ArchiveReport:
    """Read every segment back; ArchiveError at the first that cannot be trusted."""
    segments = load_manifest(root)
    if not segments:
        raise ArchiveError(f"{root}: no segments (no {MANIFEST})")
    events = sum(1 for _ in read_archive(root))
    return ArchiveReport(
        len(segments), segments[0].first, segments[-1].last, events, sum(s.bytes for s in segments)
    )


async def export(
    bus: EventBus,
    root: Path,
    upto: int | None = None,
    segment_events: int = SEGMENT_EVENTS,
    timeout_s: float = 600.0,
) -> list[Segment]:
    """Append the stream's events after the archive's last (up to `upto`, default the
    stream's last) as new segments; the new segments. The first export starts at the
    stream's first sequence; an archive that the stream no longer continues (events
    dropped before they were exported) is refused."""
    root.mkdir(parents=True, exist_ok=True)
    with open(root / ".lock", "w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            raise ArchiveError(f"{root}: another export is writing there") from exc
        return await _export(bus, root, upto, segment_events, timeout_s)


async def _export(
    bus: EventBus, root: Path, upto: int | None, segment_events: int, timeout_s: float
) -> list[Segment]:
    segments = load_manifest(root)
    figures = await bus.stream_figures()
    start = segments[-1].last + 1 if segments else max(1, figures.first_seq)
    end = figures.last_seq if upto is None else min(upto, figures.last_seq)
    if segments and figures.first_seq > start:
        raise ArchiveError(
            f"the stream starts at seq {figures.first_seq}: events {start}.."
            f"{figures.first_seq - 1} were dropped before they were exported"
        )
    if end < start:
        return []
    written: list[Segment] = []
    batch: list[Incoming] = []
    done = asyncio.Event()
    failure: list[BaseException] = []

    async def on_message(message: Incoming) -> None:
        if done.is_set() or message.seq > end:
            done.set()
            return
        batch.append(message)
        try:
            if len(batch) >= segment_events or message.seq >= end:
                written.append(write_segment(root, batch, segments))
                batch.clear()
        except (OSError, ArchiveError) as exc:
            failure.append(exc)
            done.set()
        if message.seq >= end:
            done.set()

    unsubscribe = await bus.follow(on_message, from_seq=start)
    try:
        await asyncio.wait_for(done.wait(), timeout_s)
    finally:
        await unsubscribe()
    if failure:
        raise ArchiveError(f"export stopped: {failure[0]}")
    return written

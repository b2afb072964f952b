"""Snapshots of the folded state: `(seq, state)` as bytes a service can store and start from.

A snapshot is read back from shared storage, possibly written by another version of
gpuloom, possibly cut short by a crash or damaged: `decode_snapshot` either returns a
state equal to the one encoded (`fold(log[:seq])`, so that folding `log[seq:]` onto it
gives `fold(log)`) or raises `SnapshotError` with a one-line reason, never anything
else. Decoding validates data against the model; it never runs code the data names
(no pickle).

Layout (every integer big-endian):

    MAGIC                     b"GPULOOM-SNAPSHOT\\n"
    header length             4 bytes
    header                    JSON: format, version, fingerprint, log, seq, size, compression
    payload                   zlib(JSON of the state), `size` bytes once inflated
    checksum                  sha256 of everything above (32 bytes)

The magic, the header length and the JSON header with `format` and `version` keep this
shape in every version, so that any version can name what it refuses. zlib at level 1
rather than lzma: lzma shrinks the JSON a few times more but takes a few times longer,
a snapshot is written while the service decides, and what zlib leaves is small to
store (docs/architecture.md, "Snapshots").
"""

from __future__ import annotations

import hashlib
import json
import struct
import zlib
from dataclasses import dataclass

from pydantic import ValidationError

from gpuloom.state.model import ClusterState
from gpuloom.state.snapshot_schema import schema_fingerprint, state_codec

MAGIC = b"GPULOOM-SNAPSHOT\n"
FORMAT = "gpuloom-snapshot"
#: The layout above; bump it when the layout (not the state's shape) changes. 2: the
#: header names the log (`log`).
VERSION = 2
COMPRESSION = "zlib"
#: Level 1: half the time of the default level for a fifth more bytes.
ZLIB_LEVEL = 1
MAX_HEADER = 4096
#: Refuse to inflate a payload that claims more (a guard against a crafted header or a
#: zlib bomb): 256 MiB of JSON is about 200,000 live jobs (10,000 take 11 MB), within
#: the memory a service is meant to use.
MAX_SIZE = 1 << 28
_LENGTH = struct.Struct(">I")
_DIGEST = 32


class SnapshotError(Exception):
    """A snapshot that cannot be trusted; the message is a one-line reason."""


@dataclass(frozen=True)
class SnapshotHeader:
    """What a snapshot says about itself, readable without inflating its payload."""

    format: str
    version: int
    #: `snapshot_fingerprint()` of the process that wrote it.
    fingerprint: str
    #: Which log it is the fold of: when that stream was created (a stream deleted and
    #: made anew restarts at seq 1, and a snapshot of the old one at a seq the new one
    #: reaches later must not pass for its state); "" where unknown.
    log: str
    #: The state is `fold(log[:seq])`: replay from `seq + 1`.
    seq: int
    #: Bytes of the payload's JSON once inflated.
    size: int
    compression: str


def snapshot_fingerprint() -> str:
    """The schema fingerprint this process writes and accepts (16 hex digits)."""
    return schema_fingerprint()


def encode_snapshot(state: ClusterState, log: str = "") -> bytes:
    """The snapshot of `state` at `state.seq`, a fold of `log` (`SnapshotHeader.log`). Deterministic: equal states (dicts in the
    same order, as the fold builds them) give equal bytes. Does not change `state`.

    A value that does not fit its declared type (a list where the model says tuple)
    would come back as another value: that raises (pydantic_core's
    PydanticSerializationError, a bug in the fold) rather than write such a snapshot.
    """
    return pack_snapshot(serialize_state(state), state.seq, log)


def serialize_state(state: ClusterState) -> bytes:
    """The first half of `encode_snapshot`: the state as JSON. It reads the live state,
    so it runs where nothing folds meanwhile (on the event loop, between two events).

    A field equal to its default is left out (decoding gives it back): most of a job's
    fields are empty until it runs, and most of a spec's are defaults. At 10,000 live
    jobs the JSON shrinks to about 40 %, so there is less to compress and, at a restart,
    to validate; the time on the loop is about the same (docs/benchmarks.md). Defaults
    are part of the schema's fingerprint, so a version with other defaults refuses it."""
    return state_codec().serializer.to_json(state, warnings="error", exclude_defaults=True)


def pack_snapshot(payload: bytes, seq: int, log: str = "") -> bytes:
    """The second half: compress and checksum `serialize_state`'s JSON of the state at
    `seq`. It touches no state, and zlib and sha256 release the GIL: a service runs it
    in a thread while it goes on deciding."""
    header = SnapshotHeader(
        FORMAT, VERSION, snapshot_fingerprint(), log, seq, len(payload), COMPRESSION
    )
    return _pack(header, zlib.compress(payload, ZLIB_LEVEL))


def _pack(header: SnapshotHeader, body: bytes) -> bytes:
    text = json.dumps(header.__dict__, sort_keys=True, separators=(",", ":")).encode()
    data = b"".join((MAGIC, _LENGTH.pack(len(text)), text, body))
    return data + hashlib.sha256(data).digest()


def read_snapshot_header(data: bytes) -> SnapshotHeader:
    """The header of a snapshot, for log lines and to choose one; checks only its shape."""
    return _split(data)[0]


def _split(data: bytes) -> tuple[SnapshotHeader, int]:
    """The header and where the body starts."""
    if not data:
        raise SnapshotError("empty snapshot")
    if not data.startswith(MAGIC):
        raise SnapshotError("not a gpuloom snapshot (no magic)")
    start = len(MAGIC) + _LENGTH.size
    if len(data) < start:
        raise SnapshotError("truncated snapshot (in its header)")
    (length,) = _LENGTH.unpack_from(data, len(MAGIC))
    if length > MAX_HEADER or len(data) < start + length:
        raise SnapshotError("damaged or truncated snapshot header")
    try:
        fields = json.loads(data[start : start + length])
    except (ValueError, RecursionError):
        raise SnapshotError("damaged snapshot header (not JSON)") from None
    if not isinstance(fields, dict):
        raise SnapshotError("damaged snapshot header (not an object)")
    if fields.get("format") != FORMAT:
        raise SnapshotError(f"not a gpuloom snapshot (format {fields.get('format')!r:.40})")
    if fields.get("version") != VERSION:
        raise SnapshotError(
            f"snapshot format version {fields.get('version')!r:.20}, this reads {VERSION}"
        )
    return _header(fields), start + length


def _header(fields: dict[str, object]) -> SnapshotHeader:
    names = set(SnapshotHeader.__dataclass_fields__)
    if set(fields) != names:
        raise SnapshotError("damaged snapshot header (unexpected fields)")
    header = SnapshotHeader(**fields)  # type: ignore[arg-type]
    strings = (header.fingerprint, header.log, header.compression)
    numbers = (header.seq, header.size)
    if not all(isinstance(s, str) for s in strings) or not all(
        type(n) is int and n >= 0 for n in numbers
    ):
        raise SnapshotError("damaged snapshot header (field types)")
    return header


def decode_snapshot(data: bytes, log: str | None = None) -> ClusterState:
    """The state a snapshot holds, or SnapshotError saying why it cannot be trusted.

    Checked in this order: magic and format, layout version, checksum (truncated or
    edited), the log it folds (when `log` is given), schema fingerprint (written by an
    incompatible model), payload size,
    the payload against the model, and its `seq` against the header's. The state
    returned shares nothing with any other object: fold on from it freely.
    """
    header, body = _split(data)
    end = len(data) - _DIGEST
    if end < body:
        raise SnapshotError("truncated snapshot (no checksum)")
    if hashlib.sha256(data[:end]).digest() != data[end:]:
        raise SnapshotError("snapshot checksum mismatch (truncated or edited)")
    if log is not None and header.log != log:
        raise SnapshotError(
            f"snapshot of another log (one created {_show(header.log) or 'at an unknown time'}),"
            f" this log was created {_show(log)}"
        )
    if header.fingerprint != snapshot_fingerprint():
        raise SnapshotError(
            f"snapshot written by schema {_show(header.fingerprint)}, "
            f"this is {snapshot_fingerprint()}"
        )
    if header.compression != COMPRESSION or header.size > MAX_SIZE:
        raise SnapshotError(f"snapshot payload {_show(header.compression)} of {header.size} bytes")
    payload = _inflate(data[body:end], header.size)
    try:
        state = state_codec().validator.validate_json(payload)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top"
        what = " ".join(first["msg"].split())
        raise SnapshotError(f"snapshot does not fit the model at {where:.80}: {what:.80}") from None
    if not isinstance(state, ClusterState) or state.seq != header.seq:
        raise SnapshotError("snapshot state does not match its header's seq")
    return state


def _show(text: str) -> str:
    """A header string fit for a one-line reason, whatever a damaged header holds."""
    return text[:40] if text.isascii() and text.isprintable() else repr(text)[:40]


def _inflate(body: bytes, size: int) -> bytes:
    inflater = zlib.decompressobj()
    try:
        payload = inflater.decompress(body, size + 1)
    except zlib.error:
        raise SnapshotError("snapshot payload does not inflate") from None
    if len(payload) != size or not inflater.eof or inflater.unused_data:
        raise SnapshotError("snapshot payload size does not match its header")
    return payload

"""The streams gpuloom uses, declared once: created when missing, never rewritten.

An existing stream's configuration belongs to whoever made it (an operator's
replicas, limits or placement on the 3-server deployment): a process that merely
connects must not shrink or reset it, as `update_stream` on every connect did.
So the admin's setup (`gpuloom.bus.provision`) creates the log and its dead-letter
stream only when they are missing; a service compares what it finds with what it
expected and logs each difference once, and neither it nor the read-only tools
(audit, replay, the log reader) create or change anything.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from urllib.parse import urlsplit

from nats.js import JetStreamContext
from nats.js.api import RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BadRequestError, NotFoundError

from gpuloom.events.subjects import ALL_EVENTS, ALL_VIEWS

log = logging.getLogger(__name__)

#: Defaults of a log created without expectations (`Settings` passes its own).
DEFAULT_DEDUP_WINDOW_S = 2 * 3600.0
DEFAULT_REPLICAS = 1

#: Dead letters are diagnostics, not the truth: kept 30 days, 100k or 256 MiB at most.
DEAD_LETTER_PREFIX = "gpuloom.dlq"
DEAD_LETTER_MAX_AGE_S = 30 * 24 * 3600.0
DEAD_LETTER_MAX_MSGS = 100_000
DEAD_LETTER_MAX_BYTES = 256 * 1024 * 1024

#: (stream, difference) pairs already logged by this process: each is logged once.
_warned: set[tuple[str, str]] = set()


class StreamMissingError(LookupError):
    """The stream a read-only tool was pointed at does not exist (wrong URL, or a new NATS)."""


@dataclass(frozen=True, slots=True)
class Expected:
    """What this process expects of the log; None: no expectation (a tool's defaults)."""

    dedup_window_s: float | None = None
    replicas: int | None = None


def dead_letter_stream(stream: str) -> str:
    """`GPULOOM` -> `GPULOOM_DLQ`."""
    return f"{stream}_DLQ"


def log_config(stream: str, expected: Expected) -> StreamConfig:
    """The log as design §5 has it: file storage, limits retention, no age limit."""
    return StreamConfig(
        name=stream,
        subjects=[ALL_EVENTS],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        num_replicas=expected.replicas or DEFAULT_REPLICAS,
        duplicate_window=expected.dedup_window_s or DEFAULT_DEDUP_WINDOW_S,
        allow_direct=True,
    )


def dead_letter_config(stream: str, replicas: int) -> StreamConfig:
    """The dead-letter stream beside `stream`, outside the log's subjects, bounded."""
    return StreamConfig(
        name=dead_letter_stream(stream),
        subjects=[f"{DEAD_LETTER_PREFIX}.>"],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        num_replicas=replicas,
        max_age=DEAD_LETTER_MAX_AGE_S,
        max_msgs=DEAD_LETTER_MAX_MSGS,
        max_bytes=DEAD_LETTER_MAX_BYTES,
        duplicate_window=DEFAULT_DEDUP_WINDOW_S,
        allow_direct=True,
    )


#: A tombstone of the per-node view is kept this long (a node's agent that restarts
#: later finds no record of the job, which tells it the same).
VIEW_TOMBSTONE_TTL_S = 3600


def view_stream(stream: str) -> str:
    """`GPULOOM` -> `GPULOOM_VIEW`: the per-node view (`gpuloom.state.nodeview`)."""
    return f"{stream}_VIEW"


def view_config(stream: str, replicas: int) -> StreamConfig:
    """The per-node view: the latest message per subject (a job's record on a node, a
    node's position) and nothing older, so it is bounded by the jobs on nodes; file
    storage, so agents find it after nats-server restarts; tombstones expire
    (`allow_msg_ttl`). Derived from the log by the dispatch process, which writes it
    again whole when it starts: the log stays the truth."""
    return StreamConfig(
        name=view_stream(stream),
        subjects=[ALL_VIEWS],
        storage=StorageType.FILE,
        retention=RetentionPolicy.LIMITS,
        num_replicas=replicas,
        max_msgs_per_subject=1,
        allow_msg_ttl=True,
        duplicate_window=120.0,
    )


def differences(found: StreamConfig, expected: Expected) -> list[str]:
    """How the log found differs from what this process expected, one line each.

    Compared: replicas and duplicate window (when expected), subjects, storage and
    direct get (which `EventBus.get` needs). Limits are the operator's: not compared.
    """
    lines = []
    if expected.replicas is not None and found.num_replicas != expected.replicas:
        lines.append(f"replicas {found.num_replicas} (this process expected {expected.replicas})")
    window = found.duplicate_window or 0.0
    if expected.dedup_window_s is not None and abs(window - expected.dedup_window_s) > 1e-6:
        lines.append(
            f"duplicate window {window:g}s (this process expected {expected.dedup_window_s:g}s):"
            " Nats-Msg-Id de-duplicates only within it"
        )
    if sorted(found.subjects or []) != [ALL_EVENTS]:
        lines.append(f"subjects {found.subjects} (expected [{ALL_EVENTS!r}])")
    if found.storage != StorageType.FILE:
        storage = found.storage.value if found.storage else None
        lines.append(f"storage {storage} (expected file: memory does not survive a restart)")
    if not found.allow_direct:
        lines.append("allow_direct is off (direct gets of one event fail)")
    return lines


def warn_once(stream: str, lines: list[str]) -> None:
    for line in lines:
        if (stream, line) not in _warned:
            _warned.add((stream, line))
            log.warning(
                "stream %s is not as this process expected, left unchanged: %s", stream, line
            )


async def ensure_streams(js: JetStreamContext, stream: str, expected: Expected) -> None:
    """Create the log, its dead-letter stream and the per-node view if missing; never
    change an existing one."""
    found = await _create_if_missing(js, log_config(stream, expected))
    warn_once(stream, differences(found, expected))
    replicas = found.num_replicas or DEFAULT_REPLICAS
    try:  # dead letters are diagnostics: without their stream the service still runs
        await _create_if_missing(js, dead_letter_config(stream, replicas))
    except Exception as exc:
        warn_once(dead_letter_stream(stream), [f"cannot be created ({exc}): dead letters are lost"])
    try:
        await _create_if_missing(js, view_config(stream, replicas))
    except Exception as exc:
        warn_once(view_stream(stream), [f"cannot be created ({exc}): agents cannot run jobs"])


async def check_streams(js: JetStreamContext, stream: str, expected: Expected) -> None:
    """Say (once) how the log differs from what this process expects, and when its
    dead-letter stream is missing; creates and changes nothing."""
    warn_once(stream, differences((await js.stream_info(stream)).config, expected))
    try:
        await js.stream_info(dead_letter_stream(stream))
    except NotFoundError:
        warn_once(
            dead_letter_stream(stream), ["missing (`gpuloom bus setup`): dead letters are lost"]
        )


def strip_credentials(url: str) -> str:
    """`nats://user:password@host:port` -> `nats://host:port`: what a message may show."""
    parts = urlsplit(url)
    return parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


async def require_stream(js: JetStreamContext, stream: str, where: str) -> None:
    """Raise `StreamMissingError` unless `stream` exists; creates and changes nothing."""
    try:
        await js.stream_info(stream)
    except NotFoundError:
        raise StreamMissingError(
            f"no stream {stream} at {strip_credentials(where)}: nothing has been logged there (is this the "
            "NATS of the cluster? `gpuloom bus setup` creates the log, as the admin)"
        ) from None


async def _create_if_missing(js: JetStreamContext, config: StreamConfig) -> StreamConfig:
    """The stream's configuration as found, after creating it from `config` if missing."""
    assert config.name is not None
    try:
        return (await js.stream_info(config.name)).config
    except NotFoundError:
        pass
    try:
        return (await js.add_stream(config)).config
    except BadRequestError:  # another process created it meanwhile, maybe differently
        return (await js.stream_info(config.name)).config

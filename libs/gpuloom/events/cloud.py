"""An event of the log as a CloudEvents 1.0 JSON object: the public contract of
`GET /v1/events` and of webhooks.

The payload is the event as this version reads it (upcast to its current version),
so `data` always matches the schema published for `type` (`GET /v1/schemas/events`),
whatever version wrote it:

| CloudEvents | from |
| --- | --- |
| `id` | the envelope's id (a ULID, unique in the log) |
| `source` | `/gpuloom/<writer>`: the service or agent that wrote it (`by`) |
| `type` | `io.gpuloom.<aggregate>.<EventType>.v<version>` |
| `subject` | `<aggregate>/<id>`: `job/<job id>`, `node/<name>`, `account/<name>`, ... |
| `time` | when it happened (`at`) |
| `datacontenttype`, `dataschema` | `application/json`, `/v1/schemas/events#<EventType>` |
| `data` | the payload |
| `gpuloomseq` (extension) | its sequence in the log: the order, and where to resume |
| `gpuloomprincipal` (extension) | who asked, for an event a request caused |
"""

from __future__ import annotations

from typing import Any

from gpuloom.events.codec import Recorded
from gpuloom.events.registry import EVENT_TYPES

SPEC_VERSION = "1.0"
TYPE_PREFIX = "io.gpuloom"


def cloud_type(event_type: str, aggregate: str, version: int) -> str:
    return f"{TYPE_PREFIX}.{aggregate}.{event_type}.v{version}"


def event_type_named(name: str) -> str:
    """The event type `name` names: itself (`JobFinished`), or read from the CloudEvents
    `type` the stream's events carry (`io.gpuloom.job.JobFinished.v1`, any version of it),
    so that a filter may be copied from an event; `name` unchanged when it is neither (the
    caller says it is unknown)."""
    parts = name.split(".")
    if len(parts) != 5 or ".".join(parts[:2]) != TYPE_PREFIX or not parts[4][1:].isdigit():
        return name
    aggregate, event_type, version = parts[2], parts[3], parts[4]
    known = EVENT_TYPES.get(event_type)
    if known is None or aggregate != known.AGGREGATE or version[0] != "v":
        return name
    return event_type


def to_cloudevent(recorded: Recorded) -> dict[str, Any]:
    """The CloudEvents 1.0 structured JSON form of one event of the log."""
    event, envelope = recorded.event, recorded.envelope
    cloud: dict[str, Any] = {
        "specversion": SPEC_VERSION,
        "id": envelope.id,
        "source": f"/gpuloom/{envelope.by}",
        "type": cloud_type(event.TYPE, event.AGGREGATE, event.VERSION),
        "subject": f"{event.AGGREGATE}/{event.aggregate_id()}",
        "time": envelope.at.isoformat(),
        "datacontenttype": "application/json",
        "dataschema": f"/v1/schemas/events#{event.TYPE}",
        "gpuloomseq": recorded.seq,
        "data": event.model_dump(mode="json"),
    }
    if envelope.principal is not None:
        cloud["gpuloomprincipal"] = envelope.principal
    return cloud

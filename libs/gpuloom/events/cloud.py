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

SPEC_VERSION = "1.0"
TYPE_PREFIX = "io.gpuloom"


def cloud_type(event_type: str, aggregate: str, version: int) -> str:
    return f"{TYPE_PREFIX}.{aggregate}.{event_type}.v{version}"


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

"""Heartbeat wire format (core NATS, not the log): `gpuloom.hb.<node>` carrying the node spec.

Shared by the agent (sender) and the inventory (receiver); kept beside the events
because it is part of the wire contract, though it is never written to the stream.
Anyone on the bus can publish one, so the receiver checks it at the edge: a node
name that is not a subject token would make every event about that node invalid.
"""

from __future__ import annotations

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from gpuloom.events.base import SUBJECT_TOKEN
from gpuloom.events.inventory import NodeSpec
from gpuloom.events.subjects import HEARTBEAT_PREFIX


class BadHeartbeat(ValueError):
    """A heartbeat the inventory refuses; the message says why."""


class Heartbeat(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str = Field(pattern=SUBJECT_TOKEN.pattern)
    spec: NodeSpec

    def encode(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

    @classmethod
    def received(cls, subject: str, data: bytes) -> Heartbeat:
        """The heartbeat that arrived on `subject`, or `BadHeartbeat`.

        Refused: a body that is not a heartbeat, a node name that is not a subject
        token, and a name other than the subject's last token (one node speaking
        for another).
        """
        try:
            beat = cls.model_validate_json(data)
        except ValidationError as exc:
            first = exc.errors()[0] if exc.errors() else {"loc": (), "msg": str(exc)}
            where = ".".join(str(p) for p in first["loc"]) or "body"
            raise BadHeartbeat(
                f"not a heartbeat ({exc.error_count()} errors; {where}: {first['msg']})"
            ) from None
        token = subject.removeprefix(f"{HEARTBEAT_PREFIX}.")
        if token != beat.node:
            raise BadHeartbeat(f"node {beat.node!r} heartbeats on the subject of {token!r}")
        return beat

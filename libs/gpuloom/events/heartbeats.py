"""Heartbeat wire format (core NATS, not the log): `gpuloom.hb.<node>` carrying the node spec.

Shared by the agent (sender) and the inventory (receiver); kept beside the events
because it is part of the wire contract, though it is never written to the stream.
"""

from __future__ import annotations

import orjson
from pydantic import BaseModel, ConfigDict

from gpuloom.events.inventory import NodeSpec


class Heartbeat(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    spec: NodeSpec

    def encode(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

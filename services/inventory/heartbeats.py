"""Heartbeat wire format (core NATS, not the log): `gpuloom.hb.<node>` carrying the node spec."""

from __future__ import annotations

import orjson
from pydantic import BaseModel, ConfigDict

from gpuloom.events import NodeSpec


class Heartbeat(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    node: str
    spec: NodeSpec

    def encode(self) -> bytes:
        return orjson.dumps(self.model_dump(mode="json"))

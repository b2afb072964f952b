"""Events written by the node-inventory service."""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field

from gpuloom.events.base import NodeEvent
from gpuloom.events.text import INT32_MAX, LabelKey, LabelValue, ModelName, Remark, UserName


class GpuSpec(BaseModel):
    """One GPU of a node, as discovered (NVML, nvidia-smi) or declared (simulated node)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    index: int = Field(ge=0, le=1023)
    #: A GPU's UUID (`GPU-8c3f...`): an identifier without blanks, like a user name.
    uuid: UserName
    model: ModelName
    memory_mib: int = Field(ge=0, le=INT32_MAX)
    #: `physical`: allocated whole to one job; `vgpu`: sliced (milli-GPU and memory).
    pool: Literal["physical", "vgpu"] = "physical"


class NodeSpec(BaseModel):
    """What a node agent reports about its node."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    gpus: list[GpuSpec] = Field(default_factory=list, max_length=1024)
    cpu_milli: int = Field(default=0, ge=0, le=INT32_MAX)
    memory_mib: int = Field(default=0, ge=0, le=2**50)
    labels: dict[LabelKey, LabelValue] = Field(default_factory=dict, max_length=64)
    simulated: bool = False
    #: Serves vGPU slices to replicas hosted on other nodes (remote vGPU, as OrionX).
    lends_remote_vgpu: bool = False
    #: `enforced`: the agent watches GPU memory (NVML) and stops a job over its slice;
    #: `advisory`: slices are set in the job's environment only.
    isolation: Literal["enforced", "advisory"] = "advisory"
    #: Container runtimes the agent found (podman), which run jobs that name an image.
    runtimes: list[Literal["podman"]] = Field(default_factory=list, max_length=8)

    @cached_property
    def fingerprint(self) -> bytes:
        """Canonical bytes of the spec: the inventory compares every heartbeat's spec
        with the registered one, and comparing bytes is far cheaper than model equality."""
        return orjson.dumps(self.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)


class NodeRegistered(NodeEvent):
    """A node joined, or re-joined with a changed spec."""

    TYPE: ClassVar[str] = "NodeRegistered"
    #: 2: strings and integers within what storage, the bus and exec hold.
    VERSION: ClassVar[int] = 2
    spec: NodeSpec


class NodeLost(NodeEvent):
    """The node stopped heartbeating; its jobs are requeued."""

    TYPE: ClassVar[str] = "NodeLost"
    reason: str


class NodeRecovered(NodeEvent):
    """A lost node heartbeats again and takes work."""

    TYPE: ClassVar[str] = "NodeRecovered"


class GpuPoolChanged(NodeEvent):
    """An admin moved an idle GPU of the node to another pool."""

    TYPE: ClassVar[str] = "GpuPoolChanged"
    index: int = Field(ge=0)
    pool: Literal["physical", "vgpu"]


class NodeCordoned(NodeEvent):
    """An admin took the node out of placement: nothing new lands on it; what runs stays."""

    TYPE: ClassVar[str] = "NodeCordoned"
    #: 2: strings and integers within what storage, the bus and exec hold.
    VERSION: ClassVar[int] = 2
    reason: Remark = ""


class NodeRemoved(NodeEvent):
    """An operator removed a node gone for good (decommissioned, replaced): it leaves the
    cluster, its GPUs with it. Only a node that holds no job may be removed; its agent,
    should it come back, registers it anew."""

    TYPE: ClassVar[str] = "NodeRemoved"
    reason: Remark = ""


class NodeUncordoned(NodeEvent):
    """An admin gave a cordoned node back to placement."""

    TYPE: ClassVar[str] = "NodeUncordoned"

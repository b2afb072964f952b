"""Events written by the node-inventory service."""

from __future__ import annotations

from functools import cached_property
from typing import ClassVar, Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpuloom.events.base import NodeEvent
from gpuloom.events.text import (
    INT32_MAX,
    LabelKey,
    LabelValue,
    ModelName,
    Remark,
    TopologyName,
    UserName,
)


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


class TopologyPlace(BaseModel):
    """Where a node stands at one level of the cluster's topology: its domain there."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    level: TopologyName
    domain: TopologyName


#: Levels a node may name (Slurm's topology/tree is rarely deeper than three or four).
TOPOLOGY_LEVELS_MOST = 8


def parse_topology(text: str) -> list[TopologyPlace]:
    """`nvlink=nvl-3,rack=r12,block=b2` (tightest level first) as a node's places; an
    empty text, none. ValueError naming the bad part otherwise (pydantic's, for a name)."""
    places = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        level, equals, domain = part.partition("=")
        if not equals:
            raise ValueError(f"{part!r} is not LEVEL=DOMAIN")
        places.append(TopologyPlace(level=level.strip(), domain=domain.strip()))
    if len({p.level for p in places}) != len(places):
        raise ValueError(f"a level is named twice in {text!r}")
    if len(places) > TOPOLOGY_LEVELS_MOST:
        raise ValueError(f"at most {TOPOLOGY_LEVELS_MOST} levels")
    return places


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
    #: Container runtimes the agent found (podman), which run jobs that name an image;
    #: `kubernetes`: a Kubernetes node (its kubelet runs pods, no gpuloom agent): it takes
    #: only the jobs that stand for pods, and those go nowhere else (docs/kubernetes.md).
    runtimes: list[Literal["podman", "kubernetes"]] = Field(default_factory=list, max_length=8)
    #: Its place in the cluster's topology, tightest level first (an NVLink domain,
    #: then a rack, then a block: the order the cluster's configuration gives); empty:
    #: the node names none (docs/topology.md).
    topology: list[TopologyPlace] = Field(default_factory=list, max_length=TOPOLOGY_LEVELS_MOST)

    @field_validator("topology")
    @classmethod
    def _levels_once(cls, value: list[TopologyPlace]) -> list[TopologyPlace]:
        levels = [place.level for place in value]
        if len(set(levels)) != len(levels):
            raise ValueError(f"a level is named twice: {levels}")
        return value

    def domain(self, level: str) -> str | None:
        """The node's domain at `level`, or None when it names no such level."""
        return next((p.domain for p in self.topology if p.level == level), None)

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
